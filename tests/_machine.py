"""Decide once, before Triton is imported, whether this run is on a GPU or on the CPU.

On a machine without a CUDA GPU the Triton kernels run in Triton's interpreter
(``TRITON_INTERPRET=1``) on CPU tensors at small sizes; with a GPU they compile and run at full
size. Nothing else in the suite reads the environment for this: use ``ON_GPU``/``DEVICE``.
"""

from __future__ import annotations

import os

import torch

ON_GPU: bool = torch.cuda.is_available()
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"
elif os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    raise RuntimeError(
        "a CUDA GPU is present but TRITON_INTERPRET is set: unset it to test compiled kernels"
    )

DEVICE = "cuda" if ON_GPU else "cpu"


def describe() -> str:
    if ON_GPU:
        return (
            f"GPU mode: {torch.cuda.get_device_name()} - compiled Triton kernels at full sizes, "
            "tests marked 'gpu' included"
        )
    return ("CPU mode: Triton interpreter (TRITON_INTERPRET=1) at small sizes; "
            "tests marked 'gpu' deselected")


def size(cpu: int, gpu: int) -> int:
    """The problem size for this machine: small under the interpreter, full on a GPU."""
    return gpu if ON_GPU else cpu
