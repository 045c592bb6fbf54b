"""Fused, in-place optimizer steps over many parameter tensors in one Triton launch.

Order: the jit kernels (SGD, Adam/AdamW), then the torch-facing multi-tensor launchers
``sgd_step_`` and ``adam_step_``, each a checked plan (``sgd_plan``/``adam_plan``: validation,
table, config) followed by a bare launch (``sgd_launch``/``adam_launch``), so that a caller that
keeps the plan (the optimizers do) pays only for the launch on later steps. The
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

from kernelnotes._validate import check_kernel_device, check_real, check_tensor, interpreted


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
# in-place step must not do; ``tuned_config`` times these on scratch tensors instead.
CONFIGS = [
    triton.Config({"BLOCK": 512, "ITERS": 8}, num_warps=4),
    triton.Config({"BLOCK": 1024, "ITERS": 4}, num_warps=4),
    triton.Config({"BLOCK": 1024, "ITERS": 8}, num_warps=4),
    triton.Config({"BLOCK": 2048, "ITERS": 2}, num_warps=8),
]
INTERPRETER_CONFIG = triton.Config({"BLOCK": 128, "ITERS": 2}, num_warps=4)
_TABLES: OrderedDict = OrderedDict()  # (chunk, tensors' signature) -> device table, 32 kept
_TUNED: dict = {}  # (kernel, dtype, flags) -> the fastest of CONFIGS on a 2^24-element proxy


def _interpreted() -> bool:
    return interpreted(_adam_kernel)


def _check(streams: dict[str, list], kernel) -> tuple[torch.dtype, torch.device]:
    """Every list as long as ``params``; params fp32/bf16 contiguous on one device; gradients of
    the params' dtype and shape, dense; state fp32 of the params' shape."""
    params = streams["params"]
    p0 = params[0]
    check_tensor("params[0]", p0, dtypes=PARAM_DTYPES)
    check_kernel_device("params[0]", p0, kernel)
    dtype, device = p0.dtype, p0.device
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
    return dtype, device


def _prepare(streams: dict[str, list], kernel, chunk: int) -> tuple[torch.Tensor, int, bool]:
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
    _, device = _check(streams, kernel)
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


def _first_param(params, kernel) -> torch.dtype:
    if not isinstance(params, (list, tuple)) or len(params) == 0:
        raise ValueError("params must be a non-empty list of tensors")
    check_tensor("params[0]", params[0], dtypes=PARAM_DTYPES)
    check_kernel_device("params[0]", params[0], kernel)
    return params[0].dtype


_NONNEG = "a finite number >= 0"


def _check_hyper(step=None, **rules: tuple) -> None:
    """``step`` an int >= 1 unless None; each other keyword a hyper-parameter's (value, rule), a
    rule being a key of ``check_real``'s ``REAL_RULES``: the ranges torch.optim's constructors
    accept, made finite (beta = 1 would divide by zero in the bias correction, beta > 1 take the
    root of a negative number), and dampening, which torch leaves open, a fraction."""
    import numbers  # here: the post runs this section of the file with its own imports

    if step is not None:
        if not isinstance(step, numbers.Integral):
            raise TypeError(f"step must be an int, got {type(step).__name__}")
        if step < 1:
            raise ValueError(f"step counts from 1, got {step}")
    for name, (value, rule) in rules.items():
        check_real(name, value, rule)


def _config(kind: str, dtype, flags: tuple, config):
    if config is not None:
        return config
    if _interpreted():
        return INTERPRETER_CONFIG
    key = (kind, dtype, flags)
    if key not in _TUNED:
        _TUNED[key] = tuned_config(kind, dtype, flags)
    return _TUNED[key]


def sgd_step_(params, grads, momentum_buffers=None, *, lr: float, momentum: float = 0.0,
              dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
              maximize: bool = False, first_step: bool = False, config=None) -> None:
    """One SGD step, in place, on every tensor of ``params`` in one launch (torch.optim.SGD's rule).

    ``g = grad (+ weight_decay * p)``; with momentum ``b = momentum * b + (1 - dampening) * g``
    (``b = g`` when ``first_step``), ``g = g + momentum * b`` (Nesterov) or ``g = b``; then
    ``p -= lr * g``. Polyak (1964) heavy ball; Sutskever et al. (2013) for the Nesterov form.

    Args:
        params: list of T contiguous tensors of any shapes, all float32 or all bfloat16, on one
            CUDA device (CPU under the Triton interpreter); updated in place.
        grads: T dense tensors, each of its parameter's shape and dtype.
        momentum_buffers: T float32 tensors of the parameters' shapes (updated in place);
            required when ``momentum != 0``.
        lr, momentum, dampening, weight_decay, nesterov, maximize: as torch.optim.SGD; lr,
            momentum and weight_decay must be finite and >= 0, dampening in [0, 1] (a fraction
            of g).
        first_step: the buffers are new: set them to the gradient instead of averaging.
        config: a ``triton.Config`` with BLOCK, ITERS, num_warps; None tunes on the GPU.
    """
    _check_hyper(lr=(lr, _NONNEG), momentum=(momentum, _NONNEG),
                 dampening=(dampening, "in [0, 1]"), weight_decay=(weight_decay, _NONNEG))
    plan = sgd_plan(params, grads, momentum_buffers, momentum=momentum,
                    weight_decay=weight_decay, nesterov=nesterov, maximize=maximize, config=config)
    sgd_launch(plan, lr, momentum, dampening, weight_decay, first_step)


def sgd_plan(params, grads, momentum_buffers=None, *, momentum: float = 0.0,
             weight_decay: float = 0.0, nesterov: bool = False, maximize: bool = False,
             config=None) -> tuple:
    """Check the tensors of an SGD step and return what ``sgd_launch`` needs: the table, the
    grid, the tensor count and the kernel's compile-time arguments. Valid while the tensors stay
    the same (addresses, dtypes, shapes) and the flags (momentum != 0, nesterov, weight_decay != 0,
    maximize) and the config do not change; the scalars may change on every launch."""
    streams = {"params": params, "grads": grads}
    if momentum != 0:
        if momentum_buffers is None:
            raise ValueError("momentum_buffers are required when momentum != 0")
        streams["momentum_buffers"] = momentum_buffers
    dtype = _first_param(params, _sgd_kernel)
    flags = (momentum != 0, bool(nesterov), weight_decay != 0, bool(maximize))
    cfg = _config("sgd", dtype, flags, config)
    tbl, n_chunks, aligned = _prepare(streams, _sgd_kernel,
                                      cfg.kwargs["BLOCK"] * cfg.kwargs["ITERS"])
    constexprs = dict(P_DTYPE=_TL_DTYPE[dtype], MOMENTUM=flags[0], NESTEROV=flags[1],
                      WEIGHT_DECAY=flags[2], MAXIMIZE=flags[3], ALIGNED=aligned, **cfg.kwargs,
                      num_warps=cfg.num_warps)
    return tbl, n_chunks, len(params), constexprs


def sgd_launch(plan: tuple, lr: float, momentum: float, dampening: float, weight_decay: float,
               first_step: bool) -> None:
    """The SGD launch of a ``sgd_plan``: no checks, no allocation, nothing copied to the device."""
    tbl, n_chunks, n_tensors, constexprs = plan
    if n_chunks:
        _sgd_kernel[(n_chunks,)](tbl, n_tensors, float(lr), float(momentum), 1.0 - dampening,
                                 float(weight_decay), int(first_step), **constexprs)


def adam_step_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs=None, *, step: int,
               lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
               weight_decay: float = 0.0, decoupled: bool = False, amsgrad: bool = False,
               maximize: bool = False, config=None) -> None:
    """One Adam/AdamW step, in place, on every tensor of ``params`` in one launch.

    Kingma & Ba (2015), arXiv:1412.6980, Alg. 1 with torch.optim.Adam's placement of eps;
    decoupled weight decay: Loshchilov & Hutter (2019), arXiv:1711.05101; amsgrad: Reddi et al.
    (2018). The bias corrections for step k (counted from 1) are computed here in double.

    Args:
        params: list of T contiguous tensors, all float32 or all bfloat16, on one CUDA device
            (CPU under the Triton interpreter); updated in place.
        grads: T dense tensors of the parameters' shapes and dtype.
        exp_avgs, exp_avg_sqs: T float32 tensors (m and v), updated in place.
        max_exp_avg_sqs: T float32 tensors (running max of v), required when ``amsgrad``.
        step: the step number k >= 1 (an int) of every tensor in this call.
        lr, beta1, beta2, eps, weight_decay, amsgrad, maximize: as torch.optim.Adam; lr, eps
            and weight_decay must be finite and >= 0, beta1 and beta2 in [0, 1).
        decoupled: AdamW's weight decay ``p *= 1 - lr * weight_decay`` instead of the L2 term.
        config: a ``triton.Config`` with BLOCK, ITERS, num_warps; None tunes on the GPU.
    """
    _check_hyper(step, lr=(lr, _NONNEG), beta1=(beta1, "in [0, 1)"), beta2=(beta2, "in [0, 1)"),
                 eps=(eps, _NONNEG), weight_decay=(weight_decay, _NONNEG))
    plan = adam_plan(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
                     weight_decay=weight_decay, decoupled=decoupled, amsgrad=amsgrad,
                     maximize=maximize, config=config)
    adam_launch(plan, step, lr, beta1, beta2, eps, weight_decay)


def adam_plan(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs=None, *,
              weight_decay: float = 0.0, decoupled: bool = False, amsgrad: bool = False,
              maximize: bool = False, config=None) -> tuple:
    """Check the tensors of an Adam step and return what ``adam_launch`` needs (as ``sgd_plan``;
    the flags are weight_decay != 0, decoupled, amsgrad and maximize)."""
    streams = {"params": params, "grads": grads, "exp_avgs": exp_avgs, "exp_avg_sqs": exp_avg_sqs}
    if amsgrad:
        if max_exp_avg_sqs is None:
            raise ValueError("max_exp_avg_sqs are required when amsgrad=True")
        streams["max_exp_avg_sqs"] = max_exp_avg_sqs
    dtype = _first_param(params, _adam_kernel)
    wd_mode = 0 if weight_decay == 0 else (2 if decoupled else 1)
    flags = (wd_mode, bool(amsgrad), bool(maximize))
    cfg = _config("adam", dtype, flags, config)
    tbl, n_chunks, aligned = _prepare(streams, _adam_kernel,
                                      cfg.kwargs["BLOCK"] * cfg.kwargs["ITERS"])
    constexprs = dict(P_DTYPE=_TL_DTYPE[dtype], WD_MODE=wd_mode, AMSGRAD=flags[1],
                      MAXIMIZE=flags[2], ALIGNED=aligned, **cfg.kwargs, num_warps=cfg.num_warps)
    return tbl, n_chunks, len(params), constexprs


def adam_launch(plan: tuple, step: int, lr: float, beta1: float, beta2: float, eps: float,
                weight_decay: float) -> None:
    """The Adam launch of an ``adam_plan`` at step k = ``step`` (bias corrections in double)."""
    tbl, n_chunks, n_tensors, constexprs = plan
    bc1 = 1.0 - beta1**step
    bc2_sqrt = math.sqrt(1.0 - beta2**step)
    if n_chunks:
        _adam_kernel[(n_chunks,)](
            tbl, n_tensors, lr / bc1, float(beta1), 1.0 - beta1, float(beta2), 1.0 - beta2,
            float(eps), bc2_sqrt, float(weight_decay), 1.0 - lr * weight_decay, **constexprs)


def tuned_config(kind: str, dtype=torch.float32, flags: tuple | None = None, n: int = 1 << 24):
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
            fn = functools.partial(sgd_step_, [p], [g], [state[0]], lr=1e-6,
                                   momentum=0.9 if momentum else 0, nesterov=nesterov,
                                   weight_decay=1e-6 if wd else 0, maximize=maximize, config=cfg)
        else:
            wd_mode, amsgrad, maximize = flags or (0, False, False)
            fn = functools.partial(adam_step_, [p], [g], [state[0]], [state[1]], [state[2]],
                                   step=10, lr=1e-6, weight_decay=1e-6 if wd_mode else 0,
                                   decoupled=wd_mode == 2, amsgrad=amsgrad, maximize=maximize,
                                   config=cfg)
        ms = triton.testing.do_bench(fn, warmup=5, rep=20)
        if ms < best_ms:
            best, best_ms = cfg, ms
    return best
# --8<-- [end:launcher]
