from __future__ import annotations

import pytest

from tests._machine import DEVICE, ON_GPU


@pytest.fixture
def device() -> str:
    return DEVICE


@pytest.fixture
def on_gpu() -> bool:
    return ON_GPU
