"""Fused, in-place optimizer steps over many parameter tensors in one Triton launch.

Order: the jit kernels (SGD, Adam/AdamW); the launchers, each a checked plan
(``_sgd_plan``/``_adam_plan``: validation, table, config) followed by a bare launch
(``_sgd_launch``/``_adam_launch``), so that a caller that keeps the plan (the optimizers do) pays
only for the launch on later steps; the custom operators ``kernelnotes::sgd_step_`` and
``kernelnotes::adam_step_`` (they mutate the parameters and the state, and have fake
implementations for ``torch.compile``); and the public functions ``sgd_step_`` and
``adam_step_``, which check their arguments and call the operators. The
``torch.optim.Optimizer`` classes built on them live in ``optim.py``. The post
(docs/posts/04-gradient-descent.md) derives the updates.

One launch, many tensors: the launcher writes a small int64 table on the device holding, for every
tensor, the address of each of its streams (parameter, gradient, state buffers) and its length,
and for every program the tensor and chunk it owns. A program loads its tensor's addresses from
the table, casts them to pointers and streams ``CHUNK = BLOCK * ITERS`` elements. The table only
depends on the addresses, so it is cached and reused while they stay put (the steady state of a
training loop). Step-dependent scalars (bias corrections) are computed on the host in double and
passed as fp32 arguments, as torch.optim does.
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernelnotes._validate import check_real, check_tensor, interpreted


# --8<-- [start:helpers]
@triton.jit
def _round_to(x, DTYPE: tl.constexpr):
    """fp32 x in the parameter dtype, rounded to nearest even. For bf16 this is done on the bits:
    the hardware conversion rounds so too, but Triton's interpreter truncates ``.to(bf16)``."""
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # add half an ulp (ties to even), cut
        bits = tl.where(x != x, 0x7FC0, bits)  # NaN stays NaN
        return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x


@triton.jit
def _chunk(tbl_ptr, T, S: tl.constexpr, CHUNK: tl.constexpr):
    """This program's chunk of the flattened tensor list: (row, start, n). Stream s of its tensor
    has its address at row + s*T; the chunk is elements start .. start + n of that tensor."""
    pid = tl.program_id(0)
    t = tl.load(tbl_ptr + (S + 1) * T + pid)  # the chunk map follows S*T addresses, T lengths
    start = tl.load(tbl_ptr + (S + 1) * T + tl.num_programs(0) + pid) * CHUNK
    n = tl.minimum(tl.load(tbl_ptr + S * T + t) - start, CHUNK)  # elements in this chunk
    return tbl_ptr + t, start, n


@triton.jit
def _stream(row, s: tl.constexpr, T, start, DTYPE: tl.constexpr, ALIGNED: tl.constexpr):
    """Stream s of the chunk's tensor: a DTYPE pointer to the chunk's first element."""
    ptr = tl.load(row + s * T).to(tl.pointer_type(DTYPE))
    if ALIGNED:  # every address is 16-byte aligned (checked on the host): 16-byte vector access
        ptr = tl.multiple_of(ptr, 16)
    return ptr + start
# --8<-- [end:helpers]


# --8<-- [start:sgd_kernel]
@triton.jit
def _sgd_block(p_ptr, g_ptr, b_ptr, offs, mask, lr, momentum, one_minus_dampening, weight_decay,
               first, MASKED: tl.constexpr, MOMENTUM: tl.constexpr, NESTEROV: tl.constexpr,
               WEIGHT_DECAY: tl.constexpr, MAXIMIZE: tl.constexpr):
    if MASKED:
        p = tl.load(p_ptr + offs, mask=mask).to(tl.float32)
        g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
    else:
        p = tl.load(p_ptr + offs).to(tl.float32)
        g = tl.load(g_ptr + offs).to(tl.float32)
    if MAXIMIZE:
        g = -g
    if WEIGHT_DECAY:
        g = g + weight_decay * p  # g <- g + lambda theta
    if MOMENTUM:
        if first:
            b = g  # the first step starts the buffer at g, undamped (as torch.optim.SGD)
        else:
            if MASKED:
                b = tl.load(b_ptr + offs, mask=mask)
            else:
                b = tl.load(b_ptr + offs)
            b = momentum * b + one_minus_dampening * g  # b <- mu b + (1 - tau) g
        if MASKED:
            tl.store(b_ptr + offs, b, mask=mask)
        else:
            tl.store(b_ptr + offs, b)
        if NESTEROV:
            g = g + momentum * b
        else:
            g = b
    p = p - lr * g  # theta <- theta - eta g
    if MASKED:
        tl.store(p_ptr + offs, _round_to(p, p_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(p_ptr + offs, _round_to(p, p_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=["T", "first"])  # one compile for any number of tensors
def _sgd_kernel(
    tbl_ptr,  # *int64: [S*T addresses | T lengths | chunk -> tensor | chunk -> index]
    T,  # number of tensors
    lr, momentum, one_minus_dampening, weight_decay,  # fp32 scalars
    first,  # 1 on the step that creates the momentum buffers
    P_DTYPE: tl.constexpr,  # fp32 or bf16 (parameters and gradients); the buffer is fp32
    MOMENTUM: tl.constexpr, NESTEROV: tl.constexpr, WEIGHT_DECAY: tl.constexpr,
    MAXIMIZE: tl.constexpr, ALIGNED: tl.constexpr,
    BLOCK: tl.constexpr, ITERS: tl.constexpr,
):
    S: tl.constexpr = 3 if MOMENTUM else 2  # streams: p, g (, b)
    row, start, n = _chunk(tbl_ptr, T, S, BLOCK * ITERS)
    p_ptr = _stream(row, 0, T, start, P_DTYPE, ALIGNED)
    g_ptr = _stream(row, 1, T, start, P_DTYPE, ALIGNED)
    b_ptr = g_ptr  # unused without momentum
    if MOMENTUM:
        b_ptr = _stream(row, 2, T, start, tl.float32, ALIGNED)
    for i in tl.static_range(ITERS):
        offs = i * BLOCK + tl.arange(0, BLOCK)
        if (i + 1) * BLOCK <= n:  # full block: no mask, so loads and stores are 16-byte vectors
            _sgd_block(p_ptr, g_ptr, b_ptr, offs, None, lr, momentum, one_minus_dampening,
                       weight_decay, first, False, MOMENTUM, NESTEROV, WEIGHT_DECAY, MAXIMIZE)
        elif i * BLOCK < n:
            _sgd_block(p_ptr, g_ptr, b_ptr, offs, offs < n, lr, momentum, one_minus_dampening,
                       weight_decay, first, True, MOMENTUM, NESTEROV, WEIGHT_DECAY, MAXIMIZE)
# --8<-- [end:sgd_kernel]


# --8<-- [start:adam_kernel]
@triton.jit
def _adam_block(p_ptr, g_ptr, m_ptr, v_ptr, vmax_ptr, offs, mask, step_size, beta1,
                one_minus_beta1, beta2, one_minus_beta2, eps, bc2_sqrt, weight_decay, decay,
                MASKED: tl.constexpr, WD_MODE: tl.constexpr, AMSGRAD: tl.constexpr,
                MAXIMIZE: tl.constexpr):
    if MASKED:
        p = tl.load(p_ptr + offs, mask=mask).to(tl.float32)
        g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
        m = tl.load(m_ptr + offs, mask=mask)
        v = tl.load(v_ptr + offs, mask=mask)
    else:
        p = tl.load(p_ptr + offs).to(tl.float32)
        g = tl.load(g_ptr + offs).to(tl.float32)
        m = tl.load(m_ptr + offs)
        v = tl.load(v_ptr + offs)
    if MAXIMIZE:
        g = -g
    if WD_MODE == 1:
        g = g + weight_decay * p  # Adam: L2 penalty folded into the gradient
    if WD_MODE == 2:
        p = p * decay  # AdamW: theta <- (1 - eta lambda) theta, decoupled from the moments
    m = beta1 * m + one_minus_beta1 * g  # m <- beta1 m + (1 - beta1) g
    v = beta2 * v + one_minus_beta2 * (g * g)  # v <- beta2 v + (1 - beta2) g^2
    if AMSGRAD:  # a NaN v stays in the max, as with torch.maximum (max.f32 alone drops it)
        if MASKED:
            vmax = tl.maximum(tl.load(vmax_ptr + offs, mask=mask), v,
                              propagate_nan=tl.PropagateNan.ALL)
            tl.store(vmax_ptr + offs, vmax, mask=mask)
        else:
            vmax = tl.maximum(tl.load(vmax_ptr + offs), v, propagate_nan=tl.PropagateNan.ALL)
            tl.store(vmax_ptr + offs, vmax)
        denom = tl.div_rn(tl.sqrt_rn(vmax), bc2_sqrt) + eps
    else:
        denom = tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps  # sqrt(v / (1 - beta2^k)) + eps
    p = p - tl.div_rn(step_size * m, denom)  # theta <- theta - eta/(1 - beta1^k) m / denom
    if MASKED:
        tl.store(m_ptr + offs, m, mask=mask)
        tl.store(v_ptr + offs, v, mask=mask)
        tl.store(p_ptr + offs, _round_to(p, p_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(m_ptr + offs, m)
        tl.store(v_ptr + offs, v)
        tl.store(p_ptr + offs, _round_to(p, p_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=["T"])  # one compile for any number of tensors
def _adam_kernel(
    tbl_ptr,  # *int64: [S*T addresses | T lengths | chunk -> tensor | chunk -> index]
    T,  # number of tensors
    step_size,  # eta / (1 - beta1^k)
    beta1, one_minus_beta1, beta2, one_minus_beta2, eps,
    bc2_sqrt,  # sqrt(1 - beta2^k)
    weight_decay,  # lambda (Adam's L2 penalty)
    decay,  # 1 - eta lambda (AdamW)
    P_DTYPE: tl.constexpr,  # fp32 or bf16 (parameters and gradients); m, v (and v_max) are fp32
    WD_MODE: tl.constexpr,  # 0: none, 1: L2 in the gradient (Adam), 2: decoupled (AdamW)
    AMSGRAD: tl.constexpr, MAXIMIZE: tl.constexpr, ALIGNED: tl.constexpr,
    BLOCK: tl.constexpr, ITERS: tl.constexpr,
):
    S: tl.constexpr = 5 if AMSGRAD else 4  # streams: p, g, m, v (, v_max)
    row, start, n = _chunk(tbl_ptr, T, S, BLOCK * ITERS)
    p_ptr = _stream(row, 0, T, start, P_DTYPE, ALIGNED)
    g_ptr = _stream(row, 1, T, start, P_DTYPE, ALIGNED)
    m_ptr = _stream(row, 2, T, start, tl.float32, ALIGNED)
    v_ptr = _stream(row, 3, T, start, tl.float32, ALIGNED)
    vmax_ptr = v_ptr  # unused without amsgrad
    if AMSGRAD:
        vmax_ptr = _stream(row, 4, T, start, tl.float32, ALIGNED)
    for i in tl.static_range(ITERS):
        offs = i * BLOCK + tl.arange(0, BLOCK)
        if (i + 1) * BLOCK <= n:  # full block: no mask, so loads and stores are 16-byte vectors
            _adam_block(p_ptr, g_ptr, m_ptr, v_ptr, vmax_ptr, offs, None, step_size, beta1,
                        one_minus_beta1, beta2, one_minus_beta2, eps, bc2_sqrt, weight_decay,
                        decay, False, WD_MODE, AMSGRAD, MAXIMIZE)
        elif i * BLOCK < n:
            _adam_block(p_ptr, g_ptr, m_ptr, v_ptr, vmax_ptr, offs, offs < n, step_size, beta1,
                        one_minus_beta1, beta2, one_minus_beta2, eps, bc2_sqrt, weight_decay,
                        decay, True, WD_MODE, AMSGRAD, MAXIMIZE)
# --8<-- [end:adam_kernel]


# --8<-- [start:launcher]
PARAM_DTYPES = (torch.float32, torch.bfloat16)
STATE_DTYPE = torch.float32
_TL_DTYPE = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16}

# Elements per program = BLOCK * ITERS. Register counts from ptxas for sm_90 (Adam fp32): 56, 86,
# 100, 92 per thread, so 9, 5, 5 and 2 programs fit on an SM; BLOCK=4096 with 8 warps needs 156
# and fits one, too few loads in flight. Triton's autotuner re-runs a launch to time it, which an
# in-place step must not do; ``_tuned_config`` times these on scratch tensors instead.
CONFIGS = [
    triton.Config({"BLOCK": 512, "ITERS": 8}, num_warps=4),
    triton.Config({"BLOCK": 1024, "ITERS": 4}, num_warps=4),
    triton.Config({"BLOCK": 1024, "ITERS": 8}, num_warps=4),
    triton.Config({"BLOCK": 2048, "ITERS": 2}, num_warps=8),
]
INTERPRETER_CONFIG = triton.Config({"BLOCK": 128, "ITERS": 2}, num_warps=4)
_TABLES: OrderedDict = OrderedDict()  # (chunk, tensors' signature) -> device table, 32 kept
_TUNED: dict = {}  # (kernel, dtype, flags) -> the fastest of CONFIGS on a 2^24-element proxy
_INTERPRETED = interpreted(_adam_kernel)  # TRITON_INTERPRET=1 at import: CPU tensors


def _check_first(params: list) -> None:
    """params[0] is float32 or bfloat16 on a device the kernels run on: CUDA, or CPU under the
    interpreter (decided once, at import)."""
    p0 = params[0]
    check_tensor("params[0]", p0, dtypes=PARAM_DTYPES)
    if p0.device.type != ("cpu" if _INTERPRETED else "cuda"):
        raise ValueError(
            f"params[0] is on {p0.device}, but Triton runs in the interpreter "
            "(TRITON_INTERPRET=1): pass CPU tensors" if _INTERPRETED else
            f"params[0] is on {p0.device}; compiled Triton kernels need a CUDA tensor "
            "(set TRITON_INTERPRET=1 before importing triton to run them on the CPU)")


def _check(streams: dict[str, list]) -> None:
    """Every list as long as ``params``; params fp32/bf16 contiguous on one device (CUDA, or CPU
    under the interpreter); gradients of the params' dtype and shape, dense; state fp32 of the
    params' shape. Metadata only, so it runs on fake tensors and under Dynamo too."""
    params = streams["params"]
    _check_first(params)
    dtype, device = params[0].dtype, params[0].device
    for name, tensors in streams.items():
        if len(tensors) != len(params):
            raise ValueError(f"{name} has {len(tensors)} tensors, params has {len(params)}")
        want = (dtype,) if name in ("params", "grads") else (STATE_DTYPE,)
        for i, (t, p) in enumerate(zip(tensors, params, strict=True)):
            if isinstance(t, torch.Tensor) and t.is_sparse:
                raise TypeError(f"{name}[{i}] is sparse: sparse gradients are not supported")
            check_tensor(f"{name}[{i}]", t, dtypes=want, contiguous=True, device=device)
            if t.shape != p.shape:
                raise ValueError(f"{name}[{i}] has shape {tuple(t.shape)}, params[{i}] has "
                                 f"{tuple(p.shape)}")


def _prepare(streams: dict[str, list], chunk: int) -> tuple[torch.Tensor, int, bool]:
    """The int64 table the kernel reads, its number of chunks, and whether every address is
    16-byte aligned. Cached by each tensor's (address, dtype, shape, contiguity): the inputs are
    checked (``_check``) when they are new, so a training loop pays for neither twice."""
    try:
        sig = tuple((t.data_ptr(), t.dtype, t.shape, t.is_contiguous())
                    for ts in streams.values() for t in ts)
    except (AttributeError, RuntimeError, TypeError):  # not tensors, or sparse: let _check say
        sig = None
    key = (chunk, sig)
    hit = _TABLES.get(key) if sig is not None else None
    if hit is not None:
        _TABLES.move_to_end(key)
        return hit
    _check(streams)
    device = streams["params"][0].device
    addrs = [a for a, *_ in sig]
    numels = [p.numel() for p in streams["params"]]
    counts = torch.tensor([-(-n // chunk) for n in numels], dtype=torch.int64)
    ends = torch.cumsum(counts, 0)  # chunks of tensors 0..t
    n_chunks = int(ends[-1])
    chunks = torch.arange(n_chunks)
    owner = torch.searchsorted(ends, chunks, right=True)  # chunk -> tensor
    index = chunks - (ends - counts)[owner]  # chunk -> its index inside the tensor
    host = torch.cat([torch.tensor(addrs, dtype=torch.int64),
                      torch.tensor(numels, dtype=torch.int64), owner, index])
    entry = (host.to(device), n_chunks, all(a % 16 == 0 for a in addrs))
    _TABLES[key] = entry
    if len(_TABLES) > 32:
        _TABLES.popitem(last=False)
    return entry


def _config(kind: str, dtype, flags: tuple, config):
    if config is not None:
        return config
    if _INTERPRETED:
        return INTERPRETER_CONFIG
    key = (kind, dtype, flags)
    if key not in _TUNED:
        _TUNED[key] = _tuned_config(kind, dtype, flags)
    return _TUNED[key]


def _sgd_plan(params, grads, momentum_buffers=None, *, momentum: float = 0.0,
              weight_decay: float = 0.0, nesterov: bool = False, maximize: bool = False,
              config=None) -> tuple:
    """Check the tensors of an SGD step and return what ``_sgd_launch`` needs: the table, the
    grid, the tensor count and the kernel's compile-time arguments. Valid while the tensors stay
    the same (addresses, dtypes, shapes) and the flags (momentum != 0, nesterov, weight_decay != 0,
    maximize) and the config do not change; the scalars may change on every launch."""
    streams = {"params": params, "grads": grads}
    if momentum != 0:
        streams["momentum_buffers"] = momentum_buffers
    _check_first(params)
    flags = (momentum != 0, bool(nesterov), weight_decay != 0, bool(maximize))
    cfg = _config("sgd", params[0].dtype, flags, config)
    tbl, n_chunks, aligned = _prepare(streams, cfg.kwargs["BLOCK"] * cfg.kwargs["ITERS"])
    constexprs = dict(P_DTYPE=_TL_DTYPE[params[0].dtype], MOMENTUM=flags[0], NESTEROV=flags[1],
                      WEIGHT_DECAY=flags[2], MAXIMIZE=flags[3], ALIGNED=aligned, **cfg.kwargs,
                      num_warps=cfg.num_warps)
    return tbl, n_chunks, len(params), constexprs


def _sgd_launch(plan: tuple, lr: float, momentum: float, dampening: float, weight_decay: float,
                first_step: bool) -> None:
    """The SGD launch of a ``_sgd_plan``: no checks, no allocation, nothing copied to the
    device."""
    tbl, n_chunks, n_tensors, constexprs = plan
    if n_chunks:
        _sgd_kernel[(n_chunks,)](tbl, n_tensors, float(lr), float(momentum), 1.0 - dampening,
                                 float(weight_decay), int(first_step), **constexprs)


def _adam_plan(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs=None, *,
               weight_decay: float = 0.0, decoupled_weight_decay: bool = False,
               amsgrad: bool = False, maximize: bool = False, config=None) -> tuple:
    """Check the tensors of an Adam step and return what ``_adam_launch`` needs (as
    ``_sgd_plan``; the flags are weight_decay != 0, decoupled, amsgrad and maximize)."""
    streams = {"params": params, "grads": grads, "exp_avgs": exp_avgs, "exp_avg_sqs": exp_avg_sqs}
    if amsgrad:
        streams["max_exp_avg_sqs"] = max_exp_avg_sqs
    _check_first(params)
    wd_mode = 0 if weight_decay == 0 else (2 if decoupled_weight_decay else 1)
    flags = (wd_mode, bool(amsgrad), bool(maximize))
    cfg = _config("adam", params[0].dtype, flags, config)
    tbl, n_chunks, aligned = _prepare(streams, cfg.kwargs["BLOCK"] * cfg.kwargs["ITERS"])
    constexprs = dict(P_DTYPE=_TL_DTYPE[params[0].dtype], WD_MODE=wd_mode, AMSGRAD=flags[1],
                      MAXIMIZE=flags[2], ALIGNED=aligned, **cfg.kwargs, num_warps=cfg.num_warps)
    return tbl, n_chunks, len(params), constexprs


def _adam_launch(plan: tuple, step: int, lr: float, beta1: float, beta2: float, eps: float,
                 weight_decay: float) -> None:
    """The Adam launch of an ``_adam_plan`` at step k = ``step`` (bias corrections in double)."""
    tbl, n_chunks, n_tensors, constexprs = plan
    bc1 = 1.0 - beta1**step
    bc2_sqrt = math.sqrt(1.0 - beta2**step)
    if n_chunks:
        _adam_kernel[(n_chunks,)](
            tbl, n_tensors, lr / bc1, float(beta1), 1.0 - beta1, float(beta2), 1.0 - beta2,
            float(eps), bc2_sqrt, float(weight_decay), 1.0 - lr * weight_decay, **constexprs)


def _tuned_config(kind: str, dtype=torch.float32, flags: tuple | None = None, n: int = 1 << 24):
    """The fastest of ``CONFIGS`` for one kernel variant, timed on scratch tensors of n elements.

    The real parameters are never touched, so tuning can't apply a step twice.
    """
    import triton.testing

    p = torch.rand(n, device="cuda").to(dtype)
    g = torch.rand(n, device="cuda").to(dtype)
    state = [torch.rand(n, device="cuda") for _ in range(3)]
    best, best_ms = None, math.inf
    for cfg in CONFIGS:
        if kind == "sgd":
            momentum, nesterov, wd, maximize = flags or (True, False, False, False)
            plan = _sgd_plan([p], [g], [state[0]], momentum=0.9 if momentum else 0,
                             nesterov=nesterov, weight_decay=1e-6 if wd else 0,
                             maximize=maximize, config=cfg)
            fn = functools.partial(_sgd_launch, plan, 1e-6, 0.9 if momentum else 0, 0.0,
                                   1e-6 if wd else 0, False)
        else:
            wd_mode, amsgrad, maximize = flags or (0, False, False)
            plan = _adam_plan([p], [g], [state[0]], [state[1]], [state[2]],
                              weight_decay=1e-6 if wd_mode else 0,
                              decoupled_weight_decay=wd_mode == 2, amsgrad=amsgrad,
                              maximize=maximize, config=cfg)
            fn = functools.partial(_adam_launch, plan, 10, 1e-6, 0.9, 0.999, 1e-8,
                                   1e-6 if wd_mode else 0)
        ms = triton.testing.do_bench(fn, warmup=5, rep=20)
        if ms < best_ms:
            best, best_ms = cfg, ms
    return best
# --8<-- [end:launcher]


# --8<-- [start:ops]
def _op_config(block: int, iters: int, num_warps: int):
    return None if block == 0 else triton.Config({"BLOCK": block, "ITERS": iters},
                                                 num_warps=num_warps)


@torch.library.custom_op("kernelnotes::sgd_step_", mutates_args=("params", "momentum_buffers"))
def _sgd_step_op(params: list[Tensor], grads: list[Tensor], momentum_buffers: list[Tensor],
                 lr: float, momentum: float, dampening: float, weight_decay: float,
                 nesterov: bool, maximize: bool, first_step: bool, block: int, iters: int,
                 num_warps: int) -> None:
    plan = _sgd_plan(params, grads, momentum_buffers, momentum=momentum,
                     weight_decay=weight_decay, nesterov=nesterov, maximize=maximize,
                     config=_op_config(block, iters, num_warps))
    _sgd_launch(plan, lr, momentum, dampening, weight_decay, first_step)


@_sgd_step_op.register_fake
def _(params, grads, momentum_buffers, lr, momentum, dampening, weight_decay, nesterov,
      maximize, first_step, block, iters, num_warps):
    return None  # updates its inputs in place; returns nothing


@torch.library.custom_op("kernelnotes::adam_step_",
                         mutates_args=("params", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs"))
def _adam_step_op(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor],
                  exp_avg_sqs: list[Tensor], max_exp_avg_sqs: list[Tensor], step: int,
                  lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                  decoupled_weight_decay: bool, amsgrad: bool, maximize: bool, block: int,
                  iters: int, num_warps: int) -> None:
    plan = _adam_plan(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
                      weight_decay=weight_decay, decoupled_weight_decay=decoupled_weight_decay,
                      amsgrad=amsgrad, maximize=maximize,
                      config=_op_config(block, iters, num_warps))
    _adam_launch(plan, step, lr, beta1, beta2, eps, weight_decay)


@_adam_step_op.register_fake
def _(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, step, lr, beta1, beta2, eps,
      weight_decay, decoupled_weight_decay, amsgrad, maximize, block, iters, num_warps):
    return None
# --8<-- [end:ops]


# --8<-- [start:api]
_NONNEG = "a finite number >= 0"


def _check_hyper(step=None, **rules: tuple) -> None:
    """``step`` an int >= 1 unless None; each other keyword a hyper-parameter's (value, rule), a
    rule being a key of ``check_real``'s ``REAL_RULES``: the ranges torch.optim's constructors
    accept, made finite (beta = 1 would divide by zero in the bias correction, beta > 1 take the
    root of a negative number), and dampening, which torch leaves open, a fraction."""
    import numbers  # here: the post runs this section of the file with its own imports

    if step is not None:
        if isinstance(step, bool) or not isinstance(step, (numbers.Integral, torch.SymInt)):
            raise TypeError(f"step must be an int, got {type(step).__name__}")
        if step < 1:
            raise ValueError(f"step counts from 1, got {step}")
    for name, (value, rule) in rules.items():
        check_real(name, value, rule)


def _check_flags(**flags) -> None:
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def _as_list(name: str, tensors) -> list:
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{name} must be a list of tensors, got {type(tensors).__name__}")
    return list(tensors)


def _config_ints(config) -> tuple[int, int, int]:
    """(BLOCK, ITERS, num_warps) of a ``triton.Config``; (0, 0, 0) for None (tuned)."""
    if config is None:
        return 0, 0, 0
    if not isinstance(config, triton.Config):
        raise TypeError(f"config must be a triton.Config or None, got {type(config).__name__}")
    block, iters = config.kwargs.get("BLOCK"), config.kwargs.get("ITERS")
    if (type(block) is not int or block < 16 or block & (block - 1) or type(iters) is not int
            or iters < 1 or set(config.kwargs) != {"BLOCK", "ITERS"}):
        raise ValueError(f"config must set exactly BLOCK (a power of two >= 16) and ITERS "
                         f"(an int >= 1), got {config.kwargs}")
    return block, iters, config.num_warps


def _refuse_grad(op: str, streams: dict[str, list]) -> None:
    """An optimizer step has no backward: refuse tensors that require grad in grad mode (torch's
    in-place ops refuse a leaf that requires grad, too), rather than step behind autograd's
    back."""
    if not torch.is_grad_enabled():
        return
    for name, tensors in streams.items():
        for i, t in enumerate(tensors):
            if t.requires_grad:
                raise RuntimeError(f"{op}: {name}[{i}] requires grad and grad mode is on; the "
                                   "step has no backward: call it under torch.no_grad(), as "
                                   "torch.optim does")


def sgd_step_(params: list[Tensor], grads: list[Tensor],
              momentum_buffers: list[Tensor] | None = None, *, lr: float, momentum: float = 0.0,
              dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
              maximize: bool = False, first_step: bool = False,
              config: triton.Config | None = None) -> None:
    """One SGD step, in place, on every tensor of ``params`` in one launch (torch.optim.SGD's rule).

    ``g = grad (+ weight_decay * p)``; with momentum ``b = momentum * b + (1 - dampening) * g``
    (``b = g`` when ``first_step``), ``g = g + momentum * b`` (Nesterov) or ``g = b``; then
    ``p -= lr * g``. Polyak (1964) heavy ball; Sutskever et al. (2013) for the Nesterov form.
    Calls the custom operator ``torch.ops.kernelnotes.sgd_step_`` (it mutates ``params`` and
    ``momentum_buffers``), so it works under ``torch.compile(fullgraph=True)`` and
    ``FakeTensorMode``.

    Args:
        params: list of T contiguous tensors of any shapes (empty ones too), all float32 or all
            bfloat16, on one CUDA device (CPU under the Triton interpreter); updated in place.
            An empty list is a no-op, as in torch.optim.
        grads: T dense tensors, each of its parameter's shape and dtype.
        momentum_buffers: T float32 tensors of the parameters' shapes (updated in place);
            required when ``momentum != 0``, ignored otherwise.
        lr: learning rate, finite and >= 0.
        momentum: finite and >= 0.
        dampening: in [0, 1], the share of the new gradient left out of the buffer.
        weight_decay: L2 penalty, finite and >= 0.
        nesterov: use Nesterov's form of momentum.
        maximize: step up the gradient instead of down.
        first_step: the buffers are new: set them to the gradient instead of averaging.
        config: a ``triton.Config`` setting BLOCK (a power of two) and ITERS, with num_warps;
            None picks one by timing on the GPU (the interpreter uses a small fixed one).

    Raises:
        TypeError: a list that is not a list, a tensor of the wrong dtype (params other than
            float32/bfloat16, gradients not of the params' dtype, state not float32), a sparse
            gradient, a hyperparameter that is not a real number, a flag that is not a bool, or
            a config that is not a ``triton.Config``.
        ValueError: lists of different lengths, a non-contiguous tensor, shapes that differ
            from the parameter's, tensors on several devices or on one the kernels can't use,
            missing momentum buffers, or a hyperparameter out of range or not finite.
        RuntimeError: a tensor requires grad while grad mode is on (the step has no backward).
    """
    _check_hyper(lr=(lr, _NONNEG), momentum=(momentum, _NONNEG),
                 dampening=(dampening, "in [0, 1]"), weight_decay=(weight_decay, _NONNEG))
    _check_flags(nesterov=nesterov, maximize=maximize, first_step=first_step)
    block, iters, num_warps = _config_ints(config)
    streams = {"params": _as_list("params", params), "grads": _as_list("grads", grads)}
    if momentum != 0:
        if momentum_buffers is None:
            raise ValueError("momentum_buffers are required when momentum != 0")
        streams["momentum_buffers"] = _as_list("momentum_buffers", momentum_buffers)
    if not streams["params"]:
        for name, tensors in streams.items():
            if tensors:
                raise ValueError(f"{name} has {len(tensors)} tensors, params has 0")
        return  # nothing to update, as torch.optim's functional step
    _check(streams)
    _refuse_grad("sgd_step_", streams)
    torch.ops.kernelnotes.sgd_step_(
        streams["params"], streams["grads"], streams.get("momentum_buffers", []), float(lr),
        float(momentum), float(dampening), float(weight_decay), nesterov, maximize, first_step,
        block, iters, num_warps)


def adam_step_(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor],
               exp_avg_sqs: list[Tensor], max_exp_avg_sqs: list[Tensor] | None = None, *,
               step: int, lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
               weight_decay: float = 0.0, decoupled_weight_decay: bool = False,
               amsgrad: bool = False, maximize: bool = False,
               config: triton.Config | None = None) -> None:
    """One Adam/AdamW step, in place, on every tensor of ``params`` in one launch.

    Kingma & Ba (2015), arXiv:1412.6980, Alg. 1 with torch.optim.Adam's placement of eps;
    decoupled weight decay: Loshchilov & Hutter (2019), arXiv:1711.05101; amsgrad: Reddi et al.
    (2018). The bias corrections for step k (counted from 1) are computed in double. Calls the
    custom operator ``torch.ops.kernelnotes.adam_step_`` (it mutates ``params``, ``exp_avgs``,
    ``exp_avg_sqs`` and ``max_exp_avg_sqs``), so it works under
    ``torch.compile(fullgraph=True)`` and ``FakeTensorMode``.

    Args:
        params: list of T contiguous tensors of any shapes, all float32 or all bfloat16, on one
            CUDA device (CPU under the Triton interpreter); updated in place. An empty list is a
            no-op.
        grads: T dense tensors of the parameters' shapes and dtype.
        exp_avgs: T float32 tensors, the first moments m, updated in place.
        exp_avg_sqs: T float32 tensors, the second moments v, updated in place.
        max_exp_avg_sqs: T float32 tensors (running max of v), required when ``amsgrad``.
        step: the step number k >= 1 (an int) of every tensor in this call.
        lr: learning rate, finite and >= 0.
        beta1: decay of m, in [0, 1).
        beta2: decay of v, in [0, 1).
        eps: added to the root of v, finite and >= 0.
        weight_decay: finite and >= 0; an L2 term in the gradient, or with
            ``decoupled_weight_decay`` AdamW's ``p *= 1 - lr * weight_decay``.
        decoupled_weight_decay: AdamW's decay instead of the L2 term.
        amsgrad: divide by the running maximum of v.
        maximize: step up the gradient instead of down.
        config: as in `sgd_step_`.

    Raises:
        TypeError: as `sgd_step_`, and a step that is not an int.
        ValueError: as `sgd_step_`, missing ``max_exp_avg_sqs`` with ``amsgrad``, and a
            step < 1.
        RuntimeError: a tensor requires grad while grad mode is on (the step has no backward).
    """
    _check_hyper(step, lr=(lr, _NONNEG), beta1=(beta1, "in [0, 1)"), beta2=(beta2, "in [0, 1)"),
                 eps=(eps, _NONNEG), weight_decay=(weight_decay, _NONNEG))
    _check_flags(decoupled_weight_decay=decoupled_weight_decay, amsgrad=amsgrad,
                 maximize=maximize)
    block, iters, num_warps = _config_ints(config)
    streams = {name: _as_list(name, ts) for name, ts in (
        ("params", params), ("grads", grads), ("exp_avgs", exp_avgs),
        ("exp_avg_sqs", exp_avg_sqs))}
    if amsgrad:
        if max_exp_avg_sqs is None:
            raise ValueError("max_exp_avg_sqs are required when amsgrad=True")
        streams["max_exp_avg_sqs"] = _as_list("max_exp_avg_sqs", max_exp_avg_sqs)
    if not streams["params"]:
        for name, tensors in streams.items():
            if tensors:
                raise ValueError(f"{name} has {len(tensors)} tensors, params has 0")
        return
    _check(streams)
    _refuse_grad("adam_step_", streams)
    torch.ops.kernelnotes.adam_step_(
        streams["params"], streams["grads"], streams["exp_avgs"], streams["exp_avg_sqs"],
        streams.get("max_exp_avg_sqs", []), step, float(lr), float(beta1), float(beta2),
        float(eps), float(weight_decay), decoupled_weight_decay, amsgrad, maximize, block, iters,
        num_warps)
# --8<-- [end:api]
