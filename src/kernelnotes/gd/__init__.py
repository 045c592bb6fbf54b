"""Gradient descent: NumPy references (GD, SGD, mini-batch, momentum, Adam, AdamW) and fused
Triton optimizer steps, as functions and as ``torch.optim.Optimizer`` subclasses.

The references import with NumPy only. ``SGD``, ``Adam`` and ``AdamW`` drop in for
``torch.optim``'s; ``sgd_step_`` and ``adam_step_`` step lists of tensors in place through the
custom operators ``torch.ops.kernelnotes.sgd_step_`` and ``adam_step_`` (so they work under
``torch.compile(fullgraph=True)``). Those import torch and triton on first use. The post
(docs/posts/04-gradient-descent.md) derives every update.
"""

from typing import TYPE_CHECKING

from kernelnotes._lazy import lazy_exports
from kernelnotes.gd.reference import (
    adam,
    adam_update,
    gd,
    lstsq_grad,
    lstsq_loss,
    minibatch_sgd,
    momentum,
    regime,
    sgd_update,
    step_decay,
    steps_to_tol,
    warmup_cosine,
)

_KERNEL_NAMES = ("sgd_step_", "adam_step_")
_OPTIM_NAMES = ("SGD", "Adam", "AdamW")

__all__ = [  # literal, so documentation tools read it without running the module
    "adam", "adam_update", "gd", "lstsq_grad", "lstsq_loss", "minibatch_sgd", "momentum", "regime",
    "sgd_update", "step_decay", "steps_to_tol", "warmup_cosine", "sgd_step_", "adam_step_", "SGD",
    "Adam", "AdamW",
]


if TYPE_CHECKING:  # type checkers and the API reference see them; at run time they load lazily
    from kernelnotes.gd.kernel import adam_step_, sgd_step_
    from kernelnotes.gd.optim import SGD, Adam, AdamW

__getattr__ = lazy_exports(__name__, {"kernel": _KERNEL_NAMES, "optim": _OPTIM_NAMES})
