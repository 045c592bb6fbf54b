"""Topic packages export their Triton launchers without importing torch or triton until first
use."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, tuple[str, ...]]) -> Callable[[str], object]:
    """A module ``__getattr__`` (PEP 562): ``package.<submodule>`` is imported the first time one
    of its exported names is looked up, so ``import kernelnotes.<topic>`` stays NumPy-only.

    It also gives the package a ``__dir__`` that lists the lazy names beside the loaded ones, so
    ``dir()``, tab completion and documentation tools see the whole public API.
    """
    where = {name: sub for sub, names in exports.items() for name in names}

    def __getattr__(name: str):
        sub = where.get(name)
        if sub is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{sub}"), name)

    module = sys.modules[package]  # the package whose __init__ is running this call

    def __dir__() -> list[str]:
        return sorted(set(vars(module)) | set(where))

    module.__dir__ = __dir__
    return __getattr__
