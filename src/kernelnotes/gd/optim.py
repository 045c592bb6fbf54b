"""``torch.optim.Optimizer`` subclasses whose ``step()`` is one fused Triton launch per group.

``kernelnotes.gd.SGD``, ``Adam`` and ``AdamW`` take torch.optim's arguments and keep torch's
state names (``momentum_buffer``; ``step``, ``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq``), so
they drop into a training loop and load each other's state dicts. Parameters may be float32 or
bfloat16; the optimizer state is always float32 (for bf16 parameters that is more precise than
torch.optim, which keeps the state in the parameter's dtype).
"""

from __future__ import annotations

import operator
from itertools import compress

import torch

from kernelnotes.gd.kernel import STATE_DTYPE, adam_launch, adam_plan, sgd_launch, sgd_plan

_grad = operator.attrgetter("grad")
_ptr = torch.Tensor.data_ptr
_is = operator.is_


def _float(x) -> float:
    return float(x.item()) if isinstance(x, torch.Tensor) else float(x)


def _closure_loss(closure):
    """The loss the optional closure of step() returns, evaluated with autograd on."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def _refuse(name: str, differentiable: bool, capturable: bool = False) -> None:
    if differentiable:
        raise ValueError(f"{name}: differentiable=True is not supported (the fused step is not "
                         "differentiable); use torch.optim")
    if capturable:
        raise ValueError(f"{name}: capturable=True is not supported; use torch.optim")


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


class _Cached:
    """The per-group plan cache of an optimizer (dropped whole when its state dict is replaced)."""

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


class SGD(_Cached, torch.optim.Optimizer):
    """torch.optim.SGD (momentum, dampening, Nesterov, weight decay, maximize), fused in Triton.

    Same arguments and state as torch.optim.SGD; ``foreach`` and ``fused`` are accepted and
    ignored (every step is one fused launch per group and dtype). ``config`` (keyword only) is a
    ``triton.Config`` for the kernel; None picks one by timing on the GPU.
    """

    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False,
                 *, maximize=False, foreach=None, differentiable=False, fused=None, config=None):
        if _float(lr) < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if _float(weight_decay) < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        _refuse("SGD", differentiable)
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov, maximize=maximize, foreach=foreach,
                        differentiable=differentiable, fused=fused)
        super().__init__(params, defaults)
        self.config = config

    @torch.no_grad()
    def step(self, closure=None):
        loss = _closure_loss(closure)
        for group in self.param_groups:
            params = group["params"]
            grads = list(map(_grad, params))
            momentum, weight_decay = group["momentum"], _float(group["weight_decay"])
            key = (momentum != 0, group["nesterov"], weight_decay != 0, group["maximize"],
                   self.config)
            plan = self._plan_for(group, params, key, grads) or self._build(group, params, key,
                                                                            grads)
            lr, dampening = _float(group["lr"]), group["dampening"]
            for launch, first in plan.launches:
                sgd_launch(launch, lr, momentum, dampening, weight_decay, first)
        return loss

    def _build(self, group, params, key, grads) -> _Plan:
        """Every check, state created where missing, the launches planned (and cached unless
        this step creates momentum buffers or had to copy a non-contiguous gradient)."""
        momentum = group["momentum"]
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
            launches.append((sgd_plan(ps, gs, bufs if momentum != 0 else None, momentum=momentum,
                                      weight_decay=key[2], nesterov=key[1], maximize=key[3],
                                      config=self.config), first))
            keep.append(bufs)
            cacheable &= not first
        plan = _Plan(group, self.state, params, key, grads, launches, keep)
        self._remember(group, plan, cacheable)
        return plan


class Adam(_Cached, torch.optim.Optimizer):
    """torch.optim.Adam (bias correction, amsgrad, L2 or decoupled weight decay), fused in Triton.

    Same arguments and state as torch.optim.Adam; ``foreach`` and ``fused`` are accepted and
    ignored; ``capturable`` and ``differentiable`` must be False. ``config`` as in :class:`SGD`.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 amsgrad=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False, fused=None, decoupled_weight_decay=False, config=None):
        if _float(lr) < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if eps < 0.0:
            raise ValueError(f"Invalid epsilon value: {eps}")
        for i, beta in enumerate(betas):
            if not 0.0 <= _float(beta) < 1.0:
                raise ValueError(f"Invalid beta parameter at index {i}: {beta}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        _refuse(type(self).__name__, differentiable, capturable)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize, foreach=foreach, capturable=capturable,
                        differentiable=differentiable, fused=fused,
                        decoupled_weight_decay=decoupled_weight_decay)
        super().__init__(params, defaults)
        self.config = config
        self._counters: dict = {}  # id(param group) -> float32 [len(params)] step counters

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
            if s is None or s._base is not counter or s.storage_offset() != i:
                counter[i] = 0.0 if s is None else _float(s)
                state["step"] = counter[i]
        return counter

    @torch.no_grad()
    def step(self, closure=None):
        loss = _closure_loss(closure)
        for group in self.param_groups:
            params = group["params"]
            grads = list(map(_grad, params))
            weight_decay = group["weight_decay"]
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
            lr, (beta1, beta2) = _float(group["lr"]), (_float(b) for b in group["betas"])
            for launch, rep in zip(plan.launches, plan.reps, strict=True):
                adam_launch(launch, int(ks[rep]), lr, beta1, beta2, group["eps"], weight_decay)
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
            launches.append(adam_plan(ps, gs, ms, vs, vmaxs if amsgrad else None,
                                      weight_decay=key[1], decoupled=key[2], amsgrad=amsgrad,
                                      maximize=key[3], config=self.config))
            reps.append(batch[0][0])
            keep.append((ms, vs, vmaxs))
        plan = _Plan(group, self.state, params, key, grads, launches, keep)
        plan.counter, plan.reps = counter, reps
        plan.idx = None if len(index) == len(params) else torch.tensor(index)
        plan.expect = counter.clone()
        self._remember(group, plan, cacheable)
        return plan


class AdamW(Adam):
    """torch.optim.AdamW: Adam with decoupled weight decay (default 1e-2), fused in Triton."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, maximize=False, foreach=None, capturable=False,
                 differentiable=False, fused=None, config=None):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach,
                         maximize=maximize, capturable=capturable, differentiable=differentiable,
                         fused=fused, decoupled_weight_decay=True, config=config)
