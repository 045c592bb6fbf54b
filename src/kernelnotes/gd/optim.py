"""``torch.optim.Optimizer`` subclasses whose ``step()`` is one fused Triton launch per group.

``kernelnotes.gd.SGD``, ``Adam`` and ``AdamW`` take torch.optim's arguments and keep torch's
state names (``momentum_buffer``; ``step``, ``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq``), so
they drop into a training loop and load each other's state dicts. Parameters may be float32 or
bfloat16; the optimizer state is always float32 (for bf16 parameters that is more precise than
torch.optim, which keeps the state in the parameter's dtype).
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable, Iterable
from itertools import compress
from typing import Any

import torch
from torch import Tensor

from kernelnotes.gd.kernel import (
    PARAM_DTYPES,
    STATE_DTYPE,
    _adam_launch,
    _adam_plan,
    _sgd_launch,
    _sgd_plan,
)

_grad = operator.attrgetter("grad")
_ptr = torch.Tensor.data_ptr
_is = operator.is_


def _float(x) -> float:
    return float(x.item()) if isinstance(x, torch.Tensor) else float(x)


def _number(name: str, value, what: str) -> float:
    """``value`` (a real number or a 1-element tensor, as torch.optim takes lr and betas) as a
    float; a ``TypeError`` naming ``name`` for anything else."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"Invalid {what}: {name} as a Tensor must have 1 element, got "
                             f"{value.numel()}")
        return float(value.item())
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"Invalid {what}: {name} must be a real number, got "
                        f"{type(value).__name__}")
    return float(value)


def _check_range(name: str, value, what: str, upper: float = math.inf,
                 closed: bool = False) -> None:
    """torch.optim's ``Invalid <what>: <value>`` check, made finite: ``0 <= value < upper``
    (``<= upper`` when ``closed``); NaN and infinity fail."""
    x = _number(name, value, what)
    if upper == math.inf:
        ok, rule = 0.0 <= x < math.inf, "finite and >= 0"
    elif closed:
        ok, rule = 0.0 <= x <= upper, f"in [0, {upper:g}]"
    else:
        ok, rule = 0.0 <= x < upper, f"in [0, {upper:g})"
    if not ok:
        raise ValueError(f"Invalid {what}: {name}={value!r} (must be {rule})")


def _check_bools(**flags) -> None:
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {value!r}")


def _check_optional_bools(**flags) -> None:
    for name, value in flags.items():
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"{name} must be None or a bool, got {value!r}")


def _check_betas(betas) -> None:
    if isinstance(betas, (str, bytes)) or not isinstance(betas, (tuple, list)):
        raise TypeError(f"betas must be a pair (beta1, beta2), got {type(betas).__name__}")
    if len(betas) != 2:
        raise ValueError(f"betas must be a pair (beta1, beta2), got {len(betas)} values: "
                         f"{tuple(betas)!r}")
    for i, beta in enumerate(betas):
        _check_range(f"betas[{i}]", beta, f"beta parameter at index {i}", upper=1.0)


def _check_params(name: str, params: Iterable) -> None:
    """Parameters the fused kernels can update: float32 or bfloat16, dense and contiguous."""
    for i, p in enumerate(params):
        if p.dtype not in PARAM_DTYPES:
            raise TypeError(f"{name}: params[{i}] has dtype {str(p.dtype).removeprefix('torch.')}"
                            "; the fused steps take float32 or bfloat16 parameters")
        if p.layout != torch.strided or not p.is_contiguous():
            raise ValueError(f"{name}: params[{i}] must be a dense contiguous tensor "
                             f"(shape {tuple(p.shape)}, strides {p.stride()})")


def _refuse(name: str, differentiable: bool, capturable: bool = False, foreach=None,
            fused=None) -> None:
    if differentiable:
        raise ValueError(f"{name}: differentiable=True is not supported (the fused step is not "
                         "differentiable); use torch.optim")
    if capturable:
        raise ValueError(f"{name}: capturable=True is not supported; use torch.optim")
    if fused and foreach:
        raise RuntimeError("`fused` and `foreach` cannot be `True` together.")  # torch's words


def _closure_loss(closure):
    """The loss the optional closure of step() returns, evaluated with autograd on."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def _dense_grad(p: torch.Tensor, name: str) -> torch.Tensor:
    g = p.grad
    if g.is_sparse:
        raise TypeError(f"{name} does not support sparse gradients (a parameter of shape "
                        f"{tuple(p.shape)} has one); use torch.optim.SparseAdam or dense grads")
    return g if g.is_contiguous() else g.contiguous()


def _fp32_state(state: dict, key: str, p: torch.Tensor) -> torch.Tensor:
    """The state tensor ``key``: created as fp32 zeros, or converted once if loaded otherwise."""
    buf = state.get(key)
    if buf is None:
        buf = torch.zeros_like(p, dtype=STATE_DTYPE, memory_format=torch.contiguous_format)
        state[key] = buf
    elif buf.dtype != STATE_DTYPE or not buf.is_contiguous():
        buf = state[key] = buf.to(STATE_DTYPE).contiguous()
    return buf


class _Plan:
    """What ``step()`` checked and built for one param group, reused while nothing has moved.

    A step reads every parameter's ``.grad`` and takes the fast path (no checks, nothing
    allocated or copied on the device: the launches only) when the group, the optimizer's state dict
    (``load_state_dict`` replaces both) and its number of entries, the parameter list, the flags
    and config are those of the last step, every gradient is the same object (or None) as then,
    and the updated parameters and gradients are still at the same addresses (``p.data = ...``
    to another dtype or device, or ``grad.data = ...``, moves them). Anything else rebuilds the
    plan with every check. Not seen: a tensor's metadata changed in place without moving it
    (``grad.t_()``), or an entry of ``opt.state[p]`` replaced by hand (the plan keeps the old
    buffers alive, so that is wrong but never unsafe). Gradients are kept as ids and addresses,
    not references, so ``zero_grad()`` frees them.
    """

    __slots__ = ("group", "state", "n_state", "params", "key", "grad_ids", "mask", "members",
                 "grad_ptrs", "param_ptrs", "launches", "keep", "counter", "idx", "expect", "reps")

    def __init__(self, group, state, params, key, grads, launches, keep):
        self.group, self.state, self.n_state = group, state, len(state)
        self.params, self.key, self.launches, self.keep = tuple(params), key, launches, keep
        self.grad_ids = tuple(map(id, grads))
        self.mask = [g is not None for g in grads]
        self.members = list(compress(params, self.mask))  # the parameters that get a step
        self.grad_ptrs = tuple(map(_ptr, compress(grads, self.mask)))
        self.param_ptrs = tuple(map(_ptr, self.members))

    def fits(self, group, state, params, key, grads) -> bool:
        return (self.group is group and self.state is state and len(state) == self.n_state
                and self.key == key and len(params) == len(self.params)
                and all(map(_is, params, self.params))
                and tuple(map(id, grads)) == self.grad_ids
                and tuple(map(_ptr, compress(grads, self.mask))) == self.grad_ptrs
                and tuple(map(_ptr, self.members)) == self.param_ptrs)


class _Fused(torch.optim.Optimizer):
    """What SGD and Adam share: hyperparameters checked whenever a param group is added, the
    launch ``config`` kept across pickling, and the per-group plan cache (dropped whole when the
    state dict is replaced)."""

    config: Any  # a triton.Config, or None to tune on the GPU
    _FLAG_DEFAULTS: dict = {}  # group keys an older state dict may lack, as torch's __setstate__

    def _check_group(self, group: dict) -> None:  # overridden: the hyperparameters of a group
        raise NotImplementedError

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's ``add_param_group``, after checking the group's own hyperparameters and that
        its parameters are float32 or bfloat16, dense and contiguous."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            self._check_group(group)
            _check_params(type(self).__name__, group["params"])
        except Exception:
            self.param_groups.pop()
            raise

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "config": self.__dict__.get("config")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("config", None)
        for group in self.param_groups:
            for key, value in self._FLAG_DEFAULTS.items():
                group.setdefault(key, value)

    def _plan_for(self, group, params, key, grads):
        plans = self.__dict__.setdefault("_plans", {})
        if self.__dict__.get("_plans_state") is not self.state:  # load_state_dict: start over
            plans.clear()
            self._plans_state = self.state
        plan = plans.get(id(group))
        if plan is not None and plan.fits(group, self.state, params, key, grads):
            return plan
        plans.pop(id(group), None)
        return None

    def _remember(self, group, plan, cacheable: bool):
        if cacheable:
            self._plans[id(group)] = plan


def _lr(group: dict) -> float:
    """The group's learning rate as a float: a scheduler may have set it since construction."""
    lr = _float(group["lr"])
    if not 0.0 <= lr < math.inf:
        raise ValueError(f"Invalid learning rate: lr={group['lr']!r} in a param group (must be "
                         "finite and >= 0)")
    return lr


class SGD(_Fused):
    """``torch.optim.SGD`` (momentum, dampening, Nesterov, weight decay, maximize), fused in
    Triton: each ``step()`` is one launch per param group and dtype.

    Same arguments, defaults, param groups and state (``momentum_buffer``, float32) as
    ``torch.optim.SGD``, so the two load each other's state dicts. ``foreach`` and ``fused``
    are accepted and ignored. ``step()`` runs under ``torch.no_grad()``, as torch's.

    Args:
        params: an iterable of parameters or of param-group dicts, as for torch.optim. The
            parameters must be float32 or bfloat16, dense and contiguous, on one CUDA device
            (CPU under the Triton interpreter).
        lr: learning rate, a float or a 1-element tensor, finite and >= 0.
        momentum: finite and >= 0.
        dampening: in [0, 1].
        weight_decay: L2 penalty, finite and >= 0.
        nesterov: Nesterov momentum (needs momentum > 0 and dampening 0).
        maximize: step up the gradient.
        foreach: None or a bool (ignored).
        differentiable: must be False.
        fused: None or a bool (ignored).
        config: a ``triton.Config`` (BLOCK, ITERS, num_warps) for the kernel; None picks one by
            timing on the GPU.

    Raises:
        TypeError: a hyperparameter that is not a real number (or 1-element tensor), a flag
            that is not a bool, a parameter that is not float32/bfloat16; at ``step()``, a
            sparse gradient or one of another dtype.
        ValueError: a hyperparameter out of range or not finite, Nesterov without momentum or
            with dampening, ``differentiable=True``, a non-contiguous parameter, an empty
            parameter list; at ``step()``, a parameter on a device the kernels can't use.
        RuntimeError: ``fused=True`` together with ``foreach=True``, as torch.
    """

    _FLAG_DEFAULTS = dict(nesterov=False, maximize=False, foreach=None, differentiable=False,
                          fused=None)

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]],
                 lr: float | Tensor = 1e-3, momentum: float = 0, dampening: float = 0,
                 weight_decay: float | Tensor = 0, nesterov: bool = False, *,
                 maximize: bool = False, foreach: bool | None = None,
                 differentiable: bool = False, fused: bool | None = None,
                 config: Any = None) -> None:
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov, maximize=maximize, foreach=foreach,
                        differentiable=differentiable, fused=fused)
        self._check_group(defaults)
        self.config = config
        super().__init__(params, defaults)

    def _check_group(self, group: dict) -> None:
        _check_range("lr", group["lr"], "learning rate")
        _check_range("momentum", group["momentum"], "momentum value")
        _check_range("dampening", group["dampening"], "dampening value", upper=1.0, closed=True)
        _check_range("weight_decay", group["weight_decay"], "weight_decay value")
        _check_bools(nesterov=group["nesterov"], maximize=group["maximize"],
                     differentiable=group["differentiable"])
        _check_optional_bools(foreach=group["foreach"], fused=group["fused"])
        if group["nesterov"] and (_float(group["momentum"]) <= 0
                                  or _float(group["dampening"]) != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening "
                             "(nesterov=True)")
        _refuse("SGD", group["differentiable"], foreach=group["foreach"], fused=group["fused"])

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One fused SGD step on every parameter that has a gradient.

        Args:
            closure: re-evaluates the model and returns the loss (run with grad enabled).

        Returns:
            The closure's loss, or None.
        """
        loss = _closure_loss(closure)
        for group in self.param_groups:
            params = group["params"]
            grads = list(map(_grad, params))
            momentum, weight_decay = _float(group["momentum"]), _float(group["weight_decay"])
            key = (momentum != 0, group["nesterov"], weight_decay != 0, group["maximize"],
                   self.config)
            plan = self._plan_for(group, params, key, grads) or self._build(group, params, key,
                                                                            grads)
            lr, dampening = _lr(group), _float(group["dampening"])
            for launch, first in plan.launches:
                _sgd_launch(launch, lr, momentum, dampening, weight_decay, first)
        return loss

    def _build(self, group, params, key, grads) -> _Plan:
        """Every check, state created where missing, the launches planned (and cached unless
        this step creates momentum buffers or had to copy a non-contiguous gradient)."""
        momentum = _float(group["momentum"])
        cacheable = True
        batches: dict = {}  # (dtype, device, first step?) -> (params, grads, buffers)
        for p, grad in zip(params, grads, strict=True):
            if grad is None:
                continue
            g = _dense_grad(p, "SGD")
            cacheable &= g is grad
            first, buf = False, None
            if momentum != 0:  # without momentum SGD keeps no state, as torch's
                state = self.state[p]
                first = state.get("momentum_buffer") is None
                buf = _fp32_state(state, "momentum_buffer", p)
            lists = batches.setdefault((p.dtype, p.device, first), ([], [], []))
            lists[0].append(p)
            lists[1].append(g)
            lists[2].append(buf)
        launches, keep = [], []
        for (_, _, first), (ps, gs, bufs) in batches.items():
            launches.append((_sgd_plan(ps, gs, bufs if momentum != 0 else None,
                                       momentum=momentum,
                                       weight_decay=key[2], nesterov=key[1],
                                       maximize=key[3], config=self.config), first))
            keep.append(bufs)
            cacheable &= not first
        plan = _Plan(group, self.state, params, key, grads, launches, keep)
        self._remember(group, plan, cacheable)
        return plan


class Adam(_Fused):
    """``torch.optim.Adam`` (bias correction, amsgrad, L2 or decoupled weight decay), fused in
    Triton: each ``step()`` is one launch per param group, dtype and step count.

    Same arguments, defaults, param groups and state names (``step``, ``exp_avg``,
    ``exp_avg_sq``, ``max_exp_avg_sq``) as ``torch.optim.Adam``; the moments are float32 even
    for bfloat16 parameters. ``foreach`` and ``fused`` are accepted and ignored. ``step()`` runs
    under ``torch.no_grad()``, as torch's.

    Args:
        params: an iterable of parameters or of param-group dicts, as for torch.optim; float32
            or bfloat16, dense and contiguous, on one CUDA device (CPU under the interpreter).
        lr: learning rate, a float or a 1-element tensor, finite and >= 0.
        betas: a pair (beta1, beta2), each a float or 1-element tensor in [0, 1).
        eps: finite and >= 0.
        weight_decay: finite and >= 0.
        amsgrad: divide by the running maximum of the second moment.
        foreach: None or a bool (ignored).
        maximize: step up the gradient.
        capturable: must be False.
        differentiable: must be False.
        fused: None or a bool (ignored).
        decoupled_weight_decay: AdamW's decay, ``p *= 1 - lr * weight_decay``.
        config: as in `SGD`.

    Raises:
        TypeError: as `SGD`, and betas that are not a pair of numbers.
        ValueError: as `SGD`, betas of another length or outside [0, 1), a non-finite
            or negative eps, ``capturable=True``.
        RuntimeError: ``fused=True`` together with ``foreach=True``, as torch.
    """

    _FLAG_DEFAULTS = dict(amsgrad=False, maximize=False, foreach=None, capturable=False,
                          differentiable=False, fused=None, decoupled_weight_decay=False)

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]],
                 lr: float | Tensor = 1e-3,
                 betas: tuple[float | Tensor, float | Tensor] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, amsgrad: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False, fused: bool | None = None,
                 decoupled_weight_decay: bool = False, config: Any = None) -> None:
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize, foreach=foreach, capturable=capturable,
                        differentiable=differentiable, fused=fused,
                        decoupled_weight_decay=decoupled_weight_decay)
        self._check_group(defaults)
        self.config = config
        self._counters: dict = {}  # id(param group) -> float32 [len(params)] step counters
        super().__init__(params, defaults)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for st in self.state.values():  # a step saved as a number becomes a tensor, as torch's
            if "step" in st and not torch.is_tensor(st["step"]):
                st["step"] = torch.tensor(float(st["step"]), dtype=torch.float32)

    def _check_group(self, group: dict) -> None:
        _check_range("lr", group["lr"], "learning rate")
        _check_range("eps", group["eps"], "epsilon value")
        _check_betas(group["betas"])
        _check_range("weight_decay", group["weight_decay"], "weight_decay value")
        _check_bools(amsgrad=group["amsgrad"], maximize=group["maximize"],
                     capturable=group["capturable"], differentiable=group["differentiable"],
                     decoupled_weight_decay=group["decoupled_weight_decay"])
        _check_optional_bools(foreach=group["foreach"], fused=group["fused"])
        _refuse(type(self).__name__, group["differentiable"], group["capturable"],
                group["foreach"], group["fused"])

    def _steps(self, group: dict, index: list[int], states: list[dict]) -> torch.Tensor:
        """The group's float32 step counter, with each listed state's ``step`` a view of it.

        torch keeps one 0-d CPU tensor per parameter; here they are views of one counter per
        group, so the whole group advances by one tensor op instead of one op per parameter.
        A ``step`` from elsewhere (a loaded state dict) is copied into the counter once.
        """
        n = len(group["params"])
        counters = self.__dict__.setdefault("_counters", {})  # (gone after a pickle round trip)
        counter = counters.get(id(group))
        if counter is None or counter.numel() != n:
            counter = counters[id(group)] = torch.zeros(n, dtype=torch.float32)
        for i, state in zip(index, states, strict=True):
            s = state.get("step")
            if (not isinstance(s, torch.Tensor) or s._base is not counter
                    or s.storage_offset() != i):  # new, loaded, or a float from an old dict
                counter[i] = 0.0 if s is None else _float(s)
                state["step"] = counter[i]
        return counter

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One fused Adam step on every parameter that has a gradient.

        Args:
            closure: re-evaluates the model and returns the loss (run with grad enabled).

        Returns:
            The closure's loss, or None.
        """
        loss = _closure_loss(closure)
        for group in self.param_groups:
            params = group["params"]
            grads = list(map(_grad, params))
            weight_decay = _float(group["weight_decay"])
            key = (group["amsgrad"], weight_decay != 0, group["decoupled_weight_decay"],
                   group["maximize"], self.config)
            plan = self._plan_for(group, params, key, grads)
            if plan is not None and not torch.equal(plan.counter, plan.expect):
                plan = None  # a step count was changed in place: count again
            if plan is None:
                plan = self._build(group, params, key, grads)
                if plan is None:
                    continue
            counter = plan.counter
            if plan.idx is None:  # advance every step count of the group by one
                counter += 1
            else:
                counter[plan.idx] += 1
            plan.expect.copy_(counter)
            ks = counter.tolist()
            lr, (beta1, beta2) = _lr(group), (_float(b) for b in group["betas"])
            for launch, rep in zip(plan.launches, plan.reps, strict=True):
                _adam_launch(launch, int(ks[rep]), lr, beta1, beta2, _float(group["eps"]),
                             weight_decay)
        return loss

    def _build(self, group, params, key, grads) -> _Plan | None:
        """Every check, state created where missing, the launches planned (one per dtype and
        step count) and cached unless a non-contiguous gradient had to be copied."""
        name = type(self).__name__
        amsgrad = group["amsgrad"]
        members, index, states = [], [], []
        cacheable = True
        for i, (p, grad) in enumerate(zip(params, grads, strict=True)):
            if grad is None:
                continue
            g = _dense_grad(p, name)
            cacheable &= g is grad
            state = self.state[p]
            m, v = state.get("exp_avg"), state.get("exp_avg_sq")
            if m is None or m.dtype != STATE_DTYPE or v.dtype != STATE_DTYPE:
                m, v = _fp32_state(state, "exp_avg", p), _fp32_state(state, "exp_avg_sq", p)
            vmax = _fp32_state(state, "max_exp_avg_sq", p) if amsgrad else None
            members.append((p, g, m, v, vmax))
            index.append(i)
            states.append(state)
        if not members:
            return None
        counter = self._steps(group, index, states)
        ks = counter.tolist()
        batches: dict = {}  # (dtype, device, step) -> members: tensors at different steps
        for i, member in zip(index, members, strict=True):
            batches.setdefault((member[0].dtype, member[0].device, ks[i]), []).append((i, member))
        launches, reps, keep = [], [], []
        for batch in batches.values():
            ps, gs, ms, vs, vmaxs = (list(col) for col in zip(*(m for _, m in batch), strict=True))
            launches.append(_adam_plan(ps, gs, ms, vs, vmaxs if amsgrad else None,
                                       weight_decay=key[1], decoupled_weight_decay=key[2],
                                       amsgrad=amsgrad, maximize=key[3], config=self.config))
            reps.append(batch[0][0])
            keep.append((ms, vs, vmaxs))
        plan = _Plan(group, self.state, params, key, grads, launches, keep)
        plan.counter, plan.reps = counter, reps
        plan.idx = None if len(index) == len(params) else torch.tensor(index)
        plan.expect = counter.clone()
        self._remember(group, plan, cacheable)
        return plan


class AdamW(Adam):
    """``torch.optim.AdamW``: `Adam` with decoupled weight decay (default 1e-2).

    Same arguments, defaults, checks and state as `Adam` (its param groups carry
    ``decoupled_weight_decay=True``, as torch's AdamW's do).
    """

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]],
                 lr: float | Tensor = 1e-3,
                 betas: tuple[float | Tensor, float | Tensor] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, capturable: bool = False,
                 differentiable: bool = False, fused: bool | None = None,
                 config: Any = None) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach,
                         maximize=maximize, capturable=capturable, differentiable=differentiable,
                         fused=fused, decoupled_weight_decay=True, config=config)
