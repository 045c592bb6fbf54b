"""``torch.optim.Optimizer`` subclasses whose ``step()`` is one fused Triton launch per group.

``kernelnotes.gd.SGD``, ``Adam`` and ``AdamW`` take torch.optim's arguments and keep torch's
state names (``momentum_buffer``; ``step``, ``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq``), so
they drop into a training loop and load each other's state dicts. Parameters may be float32 or
bfloat16; the optimizer state is always float32 (for bf16 parameters that is more precise than
torch.optim, which keeps the state in the parameter's dtype).
"""

from __future__ import annotations

import torch

from kernelnotes.gd.kernel import STATE_DTYPE, adam_step_, sgd_step_


def _float(x) -> float:
    return float(x.item()) if isinstance(x, torch.Tensor) else float(x)


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


class SGD(torch.optim.Optimizer):
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
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            momentum = group["momentum"]
            batches: dict = {}  # (dtype, device, first step?) -> (params, grads, buffers)
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = _dense_grad(p, "SGD")
                first, buf = False, None
                if momentum != 0:  # without momentum SGD keeps no state, as torch's
                    state = self.state[p]
                    first = state.get("momentum_buffer") is None
                    buf = _fp32_state(state, "momentum_buffer", p)
                lists = batches.setdefault((p.dtype, p.device, first), ([], [], []))
                lists[0].append(p)
                lists[1].append(g)
                lists[2].append(buf)
            for (_, _, first), (ps, gs, bufs) in batches.items():
                sgd_step_(ps, gs, bufs if momentum != 0 else None, lr=_float(group["lr"]),
                          momentum=momentum, dampening=group["dampening"],
                          weight_decay=_float(group["weight_decay"]), nesterov=group["nesterov"],
                          maximize=group["maximize"], first_step=first, config=self.config)
        return loss


class Adam(torch.optim.Optimizer):
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

    def _advance(self, group: dict, index: list[int], states: list[dict]) -> list[int]:
        """Add one to the ``step`` of each listed parameter and return the new counts.

        torch keeps one 0-d CPU tensor per parameter; here they are views of one counter per
        group, so the whole group advances by one tensor op instead of one op per parameter.
        """
        n = len(group["params"])
        counter = self._counters.get(id(group))
        if counter is None or counter.numel() != n:
            counter = self._counters[id(group)] = torch.zeros(n, dtype=torch.float32)
        steps = []
        for i, state in zip(index, states):
            if "step" not in state:
                counter[i] = 0.0
                state["step"] = counter[i]
            steps.append(state["step"])
        if all(s._base is counter for s in steps):
            if len(index) == n:
                counter += 1
                return [int(k) for k in counter.tolist()]
            idx = torch.tensor(index)
            counter[idx] += 1
            return [int(k) for k in counter[idx].tolist()]
        torch._foreach_add_(steps, 1.0)  # state loaded from elsewhere: one tensor each
        return [int(s.item()) for s in steps]

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        name = type(self).__name__
        for group in self.param_groups:
            amsgrad = group["amsgrad"]
            members, index, states = [], [], []
            for i, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                g = _dense_grad(p, name)
                state = self.state[p]
                m, v = state.get("exp_avg"), state.get("exp_avg_sq")
                if m is None or m.dtype != STATE_DTYPE or v.dtype != STATE_DTYPE:
                    m, v = _fp32_state(state, "exp_avg", p), _fp32_state(state, "exp_avg_sq", p)
                vmax = _fp32_state(state, "max_exp_avg_sq", p) if amsgrad else None
                members.append((p, g, m, v, vmax))
                index.append(i)
                states.append(state)
            if not members:
                continue
            batches: dict = {}  # (dtype, device, step) -> members: tensors at different steps
            for k, member in zip(self._advance(group, index, states), members):
                batches.setdefault((member[0].dtype, member[0].device, k), []).append(member)
            beta1, beta2 = (_float(b) for b in group["betas"])
            for (_, _, k), batch in batches.items():
                ps, gs, ms, vs, vmaxs = (list(col) for col in zip(*batch))
                adam_step_(ps, gs, ms, vs, vmaxs if amsgrad else None, step=k,
                           lr=_float(group["lr"]), beta1=beta1, beta2=beta2, eps=group["eps"],
                           weight_decay=group["weight_decay"],
                           decoupled=group["decoupled_weight_decay"], amsgrad=amsgrad,
                           maximize=group["maximize"], config=self.config)
        return loss


class AdamW(Adam):
    """torch.optim.AdamW: Adam with decoupled weight decay (default 1e-2), fused in Triton."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, maximize=False, foreach=None, capturable=False,
                 differentiable=False, fused=None, config=None):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach,
                         maximize=maximize, capturable=capturable, differentiable=differentiable,
                         fused=fused, decoupled_weight_decay=True, config=config)
