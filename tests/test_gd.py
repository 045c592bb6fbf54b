"""Gradient descent: the reference methods' math, and the fused Triton optimizer steps against
float64 references and torch.optim."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import triton

from kernelnotes._testing import UNIT_ROUNDOFF, poison_, rel_err
from kernelnotes.gd import SGD, Adam, AdamW, adam_step_, sgd_step_
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
from tests._machine import DEVICE, ON_GPU, size

U32 = UNIT_ROUNDOFF["float32"]
UBF16 = UNIT_ROUNDOFF["bfloat16"]
# Small blocks under the interpreter so that a few hundred elements span several chunks and
# leave masked tails; a typical Hopper config on the GPU.
CFG = (triton.Config({"BLOCK": 1024, "ITERS": 2}, num_warps=8) if ON_GPU
       else triton.Config({"BLOCK": 128, "ITERS": 2}, num_warps=4))
CHUNK = CFG.kwargs["BLOCK"] * CFG.kwargs["ITERS"]
# lengths that don't divide BLOCK or CHUNK, one element, an empty tensor, a 2-D shape
SHAPES = [(CHUNK + CFG.kwargs["BLOCK"] + 37,), (1,), (0,), (5, 7), (CFG.kwargs["BLOCK"] - 3,)]
STEPS = 100  # the horizon: matching torch.optim to fp32 rounding over 100 steps


def _flat(ts):
    """All tensors as one float64 vector: the error of a whole parameter list, so that one
    element that happens to end near 0 does not count as a large relative error."""
    return np.concatenate([np.ravel(t.detach().double().cpu().numpy() if hasattr(t, "detach")
                                    else t) for t in ts])


def _f64(ts):
    return [t.detach().double().cpu().numpy() for t in ts]


def _params(dtype=torch.float32, shapes=SHAPES, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(dtype).to(DEVICE) for s in shapes]


# ---------------------------------------------------------------- reference: the math


@pytest.mark.parametrize("alpha", [0.01, 0.1, 0.3, 0.5, 0.75, 1.0, 1.6, -0.1])
def test_gd_on_x_squared_is_the_geometric_sequence(alpha):
    xs = gd(lambda x: 2 * x, 1.8, alpha, 40)[:, 0]
    assert np.allclose(xs, 1.8 * (1 - 2 * alpha) ** np.arange(41), rtol=1e-13, atol=0)


@pytest.mark.parametrize("alpha", [0.01, 0.1, 0.25, 0.5, 0.6, 0.9, 0.99])
def test_steps_to_tol_is_the_first_step_under_the_tolerance(alpha):
    k = steps_to_tol(1.8, alpha, 1e-6)
    xs = np.abs(gd(lambda x: 2 * x, 1.8, alpha, k)[:, 0])
    assert xs[k] <= 1e-6 and (k == 0 or xs[k - 1] > 1e-6)


def test_steps_to_tol_is_infinite_outside_the_stable_range():
    assert steps_to_tol(1.8, 1.0, 1e-6) == math.inf
    assert steps_to_tol(1.8, 1.6, 1e-6) == math.inf
    assert steps_to_tol(1.8, 0.0, 1e-6) == math.inf


@pytest.mark.parametrize("alpha", np.linspace(-0.2, 1.4, 33))
def test_regimes_match_the_iterates(alpha):
    xs = gd(lambda x: 2 * x, 1.8, alpha, 12)[:, 0]
    name = regime(alpha)
    steps = np.diff(np.abs(xs))
    signs = np.sign(xs[:-1]) * np.sign(xs[1:])
    if name == "monotone":
        assert np.all(xs > 0) and np.all(steps < 0)
    elif name == "one step":
        assert xs[1] == 0.0
    elif name == "oscillating, convergent":
        assert np.all(signs < 0) and np.all(steps < 0)
    elif name == "oscillating forever":
        assert np.allclose(np.abs(xs), 1.8)
    elif name == "oscillating, divergent":
        assert np.all(signs < 0) and np.all(steps > 0)
    elif name == "monotone, divergent":
        assert np.all(signs > 0) and np.all(steps > 0)
    else:
        assert name == "no progress" and np.all(xs == 1.8)


def test_2d_paraboloid_moves_each_axis_by_its_own_factor():
    alpha = 0.3
    path = gd(lambda t: np.array([2 * t[0], 4 * t[1]]), [-4.0, 2.0], alpha, 20)
    k = np.arange(21)
    assert np.allclose(path[:, 0], -4.0 * (1 - 2 * alpha) ** k, rtol=1e-12)
    assert np.allclose(path[:, 1], 2.0 * (1 - 4 * alpha) ** k, rtol=1e-12, atol=1e-300)


def test_lstsq_gradient_is_the_derivative_and_gd_reaches_lstsq():
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(50, 4)), rng.normal(size=50)
    theta = rng.normal(size=4)
    h = 1e-6
    fd = [(lstsq_loss(X, y, theta + h * e) - lstsq_loss(X, y, theta - h * e)) / (2 * h)
          for e in np.eye(4)]
    assert rel_err(lstsq_grad(X, y, theta), fd) < 1e-8
    L = 2 * np.linalg.eigvalsh(X.T @ X / 50).max()  # Lipschitz constant of the gradient
    path = gd(lambda t: lstsq_grad(X, y, t), np.zeros(4), 1 / L, 2000)
    assert rel_err(path[-1], np.linalg.lstsq(X, y, rcond=None)[0]) < 1e-12


def test_full_batch_minibatch_sgd_is_gd_and_single_rows_are_unbiased():
    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(40, 3)), rng.normal(size=40)
    path = minibatch_sgd(X, y, np.zeros(3), 0.05, batch=40, n_epochs=10, rng=rng)
    assert np.allclose(path, gd(lambda t: lstsq_grad(X, y, t), np.zeros(3), 0.05, 10), rtol=1e-13)
    theta = rng.normal(size=3)
    mean_single = np.mean([lstsq_grad(X[i:i + 1], y[i:i + 1], theta) for i in range(40)], axis=0)
    assert rel_err(mean_single, lstsq_grad(X, y, theta)) < 1e-14
    assert len(minibatch_sgd(X, y, np.zeros(3), 0.01, batch=16, n_epochs=2, rng=rng)) == 2 * 3 + 1


def test_heavy_ball_is_torchs_momentum_buffer_form():
    grad = lambda t: np.array([2 * t[0], 20 * t[1]])  # noqa: E731
    hb = momentum(grad, [1.0, 1.0], 0.02, 0.9, 50)
    theta, buf, path = np.array([1.0, 1.0]), None, [np.array([1.0, 1.0])]
    for _ in range(50):
        theta, buf = sgd_update(theta, grad(theta), buf, lr=0.02, momentum=0.9)
        path.append(theta)
    assert rel_err(np.array(path), hb) < 1e-14


def test_adam_first_step_moves_every_coordinate_by_lr():
    g = np.array([1e-4, -3.0, 250.0])
    theta, *_ = adam_update(np.zeros(3), g, np.zeros(3), np.zeros(3), 1, lr=0.01, eps=1e-12)
    # bias correction: m_hat = g, v_hat = g^2
    assert np.allclose(theta, -0.01 * np.sign(g), rtol=1e-6)


def test_adamw_decays_towards_zero_without_gradient():
    path = adam(lambda t: np.zeros_like(t), [2.0], 10, lr=0.1, weight_decay=0.5,
                decoupled_weight_decay=True)
    assert np.allclose(path[:, 0], 2.0 * 0.95 ** np.arange(11), rtol=1e-14)


def test_schedules():
    assert [step_decay(k, 1.0, 0.5, 10) for k in (0, 9, 10, 25)] == [1.0, 1.0, 0.5, 0.25]
    lrs = [warmup_cosine(k, 1.0, 5, 105, lr_min=0.1) for k in range(106)]
    assert lrs[0] == pytest.approx(0.2) and lrs[4] == 1.0 and lrs[5] == 1.0
    assert lrs[55] == pytest.approx(0.55) and lrs[105] == pytest.approx(0.1)
    assert np.all(np.diff(lrs[5:]) <= 0)


# ---------------------------------------------------------------- kernels: float64 references


def _sgd_reference(ps, gs, bufs, **hyper):
    return [sgd_update(p, g, b, **hyper) for p, g, b in zip(ps, gs, bufs, strict=True)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hyper", [
    dict(lr=0.1),
    dict(lr=0.1, momentum=0.9, dampening=0.25, weight_decay=0.01),
    dict(lr=0.05, momentum=0.8, nesterov=True, maximize=True),
])
def test_sgd_step_matches_float64_and_writes_every_buffer_element(dtype, hyper):
    ps, gs = _params(dtype), _params(dtype, seed=1)
    has_m = hyper.get("momentum", 0) != 0
    bufs = [poison_(torch.empty(p.shape, device=DEVICE)) for p in ps] if has_m else None
    p64, g64 = _f64(ps), _f64(gs)
    b64 = [None] * len(ps)
    for k in range(3):  # step 1 creates the buffers (poisoned: every element must be written)
        out = _sgd_reference(p64, g64, b64, **hyper)
        p64, b64 = [o[0] for o in out], [o[1] for o in out]
        sgd_step_(ps, gs, bufs, first_step=k == 0, config=CFG, **hyper)
        if dtype == torch.bfloat16:  # the parameter lives in bf16: round the reference likewise
            p64 = [torch.from_numpy(p).to(dtype).double().numpy() for p in p64]
    u = UNIT_ROUNDOFF[str(dtype).removeprefix("torch.")]
    assert rel_err(_flat(ps), _flat(p64)) < 10 * u, rel_err(_flat(ps), _flat(p64))
    if has_m:  # fp32 state; in bf16 mode weight decay averages in the bf16-rounded params (see
        # the Adam test below), else the buffer sees the very gradients the reference sees
        su = u if hyper.get("weight_decay", 0) != 0 else U32
        assert rel_err(_flat(bufs), _flat(b64)) < 10 * su


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hyper", [
    dict(lr=1e-2),
    dict(lr=1e-2, weight_decay=0.1, amsgrad=True),
    dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True, maximize=True, beta1=0.8,
         beta2=0.99, eps=1e-6),
])
def test_adam_step_matches_float64(dtype, hyper):
    ps, gs = _params(dtype), _params(dtype, seed=1)
    amsgrad = hyper.get("amsgrad", False)
    ms = [torch.zeros(p.shape, device=DEVICE) for p in ps]
    vs = [torch.zeros(p.shape, device=DEVICE) for p in ps]
    vmaxs = [torch.zeros(p.shape, device=DEVICE) for p in ps] if amsgrad else None
    p64, g64 = _f64(ps), _f64(gs)
    m64, v64, vm64 = _f64(ms), _f64(vs), _f64(ms)
    for k in range(1, 4):
        gsk = [torch.from_numpy(g * (1 + 0.5 * k)).to(dtype).to(DEVICE) for g in g64]
        g64k = _f64(gsk)  # gradients that change between steps, as the kernel sees them
        out = [adam_update(p, g, m, v, k, vmax=vm, **hyper)
               for p, g, m, v, vm in zip(p64, g64k, m64, v64, vm64, strict=True)]
        p64, m64, v64, vm64 = (list(col) for col in zip(*out, strict=True))
        adam_step_(ps, gsk, ms, vs, vmaxs, step=k, config=CFG, **hyper)
        if dtype == torch.bfloat16:
            p64 = [torch.from_numpy(p).to(dtype).double().numpy() for p in p64]
    u = UNIT_ROUNDOFF[str(dtype).removeprefix("torch.")]
    assert rel_err(_flat(ps), _flat(p64)) < 10 * u, rel_err(_flat(ps), _flat(p64))
    # m, v (and v_max) are fp32 sums of the very gradients the reference sees: fp32 accuracy. But
    # Adam's L2 term folds the bf16 parameter into them, and where the kernel's fp32 parameter and
    # the float64 one round to neighbouring bf16 values that element's moments differ by ~u_bf16.
    l2 = hyper.get("weight_decay", 0) != 0 and not hyper.get("decoupled_weight_decay", False)
    su = u if l2 else U32
    for t, r in ((ms, m64), (vs, v64)) + (((vmaxs, vm64),) if amsgrad else ()):
        assert rel_err(_flat(t), _flat(r)) < 10 * su, rel_err(_flat(t), _flat(r))


def test_steps_write_only_inside_their_tensors_at_any_alignment():
    """Parameters are views at odd offsets of a sentinel-filled buffer: the unaligned path runs,
    every element moves, and nothing outside the views is written."""
    n = [CHUNK + 5, 3, CFG.kwargs["BLOCK"] + 1]
    store = torch.full((sum(n) + 40,), 7.0, device=DEVICE)
    views, off = [], 1  # offset 1 float: 4-byte aligned, not 16
    for k in n:
        views.append(store[off:off + k])
        off += k + 13
    before = [v.clone() for v in views]
    grads = [torch.ones_like(v) for v in views]
    m = [torch.zeros_like(v) for v in views]
    v2 = [torch.zeros_like(v) for v in views]
    adam_step_(views, grads, m, v2, step=1, lr=0.5, config=CFG)
    inside = torch.zeros_like(store, dtype=torch.bool)
    off = 1
    for k in n:
        inside[off:off + k] = True
        off += k + 13
    assert torch.all(store[~inside] == 7.0)
    for v, b in zip(views, before, strict=True):
        assert torch.allclose(v, b - 0.5)  # the first Adam step moves by lr * sign(g)


def _assert_same_nonfinite_and_close(got, want, tol):
    """NaN exactly where ``want`` has NaN, the same infinities, the finite entries within tol."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    assert torch.equal(got.isnan(), want.isnan())
    inf = want.isinf()
    assert torch.equal(got.isinf(), inf) and torch.equal(got[inf], want[inf])
    fin = want.isfinite()
    assert rel_err(got[fin], want[fin]) < tol, rel_err(got[fin], want[fin])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("kind, hyper", [
    ("sgd", dict(lr=0.1)),
    ("sgd", dict(lr=0.1, momentum=0.9, dampening=0.25, weight_decay=0.01, maximize=True)),
    ("sgd", dict(lr=0.1, momentum=0.9, nesterov=True)),
    ("adam", dict(lr=1e-2, weight_decay=0.1)),
    ("adam", dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True, maximize=True)),
])
def test_nan_and_inf_gradients_give_torch_optims_result(kind, hyper, bad, dtype):
    """A NaN or +-inf gradient entry (in a full block, in a masked tail, in a 2-D tensor) makes
    its parameter what torch.optim makes it (NaN, or the same infinity) over two steps, and every
    other entry what torch has; bf16 parameters take _round_to's NaN branch."""
    shapes = [(CFG.kwargs["BLOCK"] + 37,), (5, 7)]
    ps, gs = _params(dtype, shapes), _params(dtype, shapes, seed=1)
    bad_at = [torch.zeros(g.shape, dtype=torch.bool, device=DEVICE) for g in gs]
    for i, idx, sign in ((0, 5, 1.0), (0, -2, -1.0), (1, (2, 3), 1.0)):
        gs[i][idx], bad_at[i][idx] = sign * bad, True
    # torch.optim in fp32 on the same values, its parameters rounded to dtype after each step: our
    # state is fp32 for bf16 parameters too (torch's would be bf16)
    qs = [p.to(torch.float32, copy=True) for p in ps]
    p64, g64 = _f64(ps), _f64(gs)
    if kind == "sgd":
        ref = torch.optim.SGD(qs, **hyper)
        states = [[torch.zeros(p.shape, device=DEVICE) for p in ps]] if "momentum" in hyper else []
    else:
        ref = torch.optim.Adam(qs, **hyper)
        states = [[torch.zeros(p.shape, device=DEVICE) for p in ps] for _ in range(2)]
        s64 = [(0 * p, 0 * p) for p in p64]  # m, v of the float64 reference, for the state
    # inf - inf and inf / inf are meant here (the interpreter and the reference run NumPy)
    with np.errstate(invalid="ignore"):
        for k in (1, 2):
            for q, g in zip(qs, gs, strict=True):  # a copy: torch's foreach nesterov step
                q.grad = g.to(torch.float32, copy=True)  # adds the buffer to .grad in place
            ref.step()
            with torch.no_grad():
                for q in qs:
                    q.copy_(q.to(dtype))
            if kind == "sgd":
                sgd_step_(ps, gs, states[0] if states else None, first_step=k == 1, config=CFG,
                          **hyper)
            else:
                adam_step_(ps, gs, *states, step=k, config=CFG, **hyper)
                out = [adam_update(p, g, *s, k, **hyper)
                       for p, g, s in zip(p64, g64, s64, strict=True)]
                p64 = [torch.from_numpy(o[0]).to(dtype).double().numpy() for o in out]
                s64 = [o[1:3] for o in out]
    u = UNIT_ROUNDOFF[str(dtype).removeprefix("torch.")]
    for p, q, at in zip(ps, qs, bad_at, strict=True):
        assert torch.equal(~q.isfinite(), at)  # torch: the bad entries, and only they
        _assert_same_nonfinite_and_close(p, q, 10 * u)
    # SGD's buffer against torch's; Adam's m and v against the float64 reference instead: torch
    # updates m by m.lerp_(g, 1 - beta1) = m + (1 - beta1)(g - m), NaN for m = g = inf, where
    # ours (the paper's beta1 m + (1 - beta1) g) stays inf. Tolerance as in
    # test_adam_step_matches_float64.
    l2 = hyper.get("weight_decay", 0) != 0 and not hyper.get("decoupled_weight_decay", False)
    su = u if l2 else U32
    for j, ours in enumerate(states):
        wants = ([ref.state[q]["momentum_buffer"] for q in qs] if kind == "sgd"
                 else [torch.from_numpy(s[j]) for s in s64])
        for t, want in zip(ours, wants, strict=True):
            _assert_same_nonfinite_and_close(t, want, 10 * su)


def test_amsgrad_max_takes_a_nan_as_torch_does():
    """A NaN gradient makes v NaN; torch.maximum keeps it in max_exp_avg_sq, and so must the
    kernel (the GPU's max.f32 alone would return the other operand)."""
    shape = (CFG.kwargs["BLOCK"] + 37,)
    (p,), (g,) = _params(torch.float32, [shape]), _params(torch.float32, [shape], seed=1)
    g[5] = g[-2] = math.nan  # in a full block and in the masked tail
    q = p.clone()
    q.grad = g.clone()
    ref = torch.optim.Adam([q], lr=1e-2, amsgrad=True)
    ref.step()
    m, v, vmax = (torch.zeros(shape, device=DEVICE) for _ in range(3))
    adam_step_([p], [g], [m], [v], [vmax], step=1, lr=1e-2, amsgrad=True, config=CFG)
    want = ref.state[q]["max_exp_avg_sq"]
    assert torch.equal(vmax.isnan(), want.isnan()) and vmax.isnan().sum() == 2
    fin = ~want.isnan()
    assert rel_err(vmax[fin], want[fin]) < 10 * U32
    _assert_same_nonfinite_and_close(p, q, 10 * U32)


# ---------------------------------------------------------------- optimizers against torch.optim


def _run_pair(ours_cls, torch_cls, kwargs, steps, dtype=torch.float32, shapes=SHAPES):
    """Both optimizers from the same start on the same gradient sequence; returns the params."""
    ps = _params(dtype, shapes)
    qs = [p.clone() for p in ps]
    ours = ours_cls(ps, **kwargs, config=CFG)
    ref = torch_cls(qs, **kwargs)
    gen = torch.Generator().manual_seed(2)
    for _ in range(steps):
        for p, q in zip(ps, qs, strict=True):
            g = torch.randn(p.shape, generator=gen).to(dtype).to(DEVICE)
            p.grad, q.grad = g, g.clone()
        ours.step()
        ref.step()
    return ps, qs, ours, ref


def _replay_f64(kind, kwargs, steps, shapes=SHAPES):
    """The same 100 steps in float64 by the reference updates."""
    ps = _f64(_params(torch.float32, shapes))
    gen = torch.Generator().manual_seed(2)
    state = [dict() for _ in ps]
    hyper = dict(kwargs)
    for k in range(1, steps + 1):
        gs = _f64([torch.randn(s, generator=gen) for s in shapes])
        for i, (p, g) in enumerate(zip(ps, gs, strict=True)):
            if kind == "sgd":
                ps[i], state[i]["b"] = sgd_update(p, g, state[i].get("b"), **hyper)
            else:
                h = {k2: v for k2, v in hyper.items() if k2 != "betas"}
                b1, b2 = hyper.get("betas", (0.9, 0.999))
                m, v, vm = (state[i].get(key, 0 * p) for key in ("m", "v", "vm"))
                ps[i], state[i]["m"], state[i]["v"], state[i]["vm"] = adam_update(
                    p, g, m, v, k, beta1=b1, beta2=b2, vmax=vm, **h)
    return ps


@pytest.mark.parametrize("kind, ours_cls, torch_cls, kwargs", [
    ("sgd", SGD, torch.optim.SGD, dict(lr=0.01, momentum=0.9, dampening=0.1, weight_decay=1e-2)),
    ("sgd", SGD, torch.optim.SGD, dict(lr=0.01, momentum=0.9, nesterov=True)),
    ("adam", Adam, torch.optim.Adam, dict(lr=1e-2, weight_decay=1e-2)),
    ("adam", AdamW, torch.optim.AdamW, dict(lr=1e-2, amsgrad=True, betas=(0.8, 0.99))),
])
def test_100_steps_match_torch_optim_to_fp32_rounding(kind, ours_cls, torch_cls, kwargs):
    shapes = SHAPES if ON_GPU else [(CFG.kwargs["BLOCK"] + 37,), (5, 7)]  # interpreter: 2 programs
    ps, qs, *_ = _run_pair(ours_cls, torch_cls, kwargs, STEPS, shapes=shapes)
    if ours_cls is AdamW:
        kwargs = dict(kwargs, decoupled_weight_decay=True, weight_decay=1e-2)
    r64 = _replay_f64(kind, kwargs, STEPS, shapes)
    p, q, r = _flat(ps), _flat(qs), _flat(r64)
    # 100 steps each add a rounding of relative size u, and the momentum buffer sums ~10
    # gradients: allow 10 u sqrt(100) between us and torch; against float64 we must be as
    # accurate as torch itself (within 2x, or 10 u)
    assert rel_err(p, q) < 10 * U32 * math.sqrt(STEPS), rel_err(p, q)
    assert rel_err(p, r) < max(2 * rel_err(q, r), 10 * U32), (rel_err(p, r), rel_err(q, r))


@pytest.mark.parametrize("ours_cls, torch_cls, kwargs", [
    (SGD, torch.optim.SGD, dict(lr=0.1)),
    (SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.5, weight_decay=0.1, maximize=True)),
    (Adam, torch.optim.Adam, dict(lr=1e-2, amsgrad=True, maximize=True)),
    (Adam, torch.optim.Adam, dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True)),
    (AdamW, torch.optim.AdamW, dict(lr=1e-2)),
])
def test_options_match_torch_optim(ours_cls, torch_cls, kwargs):
    ps, qs, ours, ref = _run_pair(ours_cls, torch_cls, kwargs, size(4, 20))
    assert rel_err(_flat(ps), _flat(qs)) < 10 * U32 * math.sqrt(size(4, 20))
    for sp, sq in zip(ours.state.values(), ref.state.values(), strict=True):
        assert sp.keys() == sq.keys()  # torch's state names: state dicts load either way


def test_drops_into_a_training_loop_and_state_dicts_interchange():
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1)).to(DEVICE)
    twin = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1)).to(DEVICE)
    twin.load_state_dict(model.state_dict())
    x, y = torch.randn(64, 6, device=DEVICE), torch.randn(64, 1, device=DEVICE)
    ours = AdamW(model.parameters(), lr=1e-2, config=CFG)
    ref = torch.optim.AdamW(twin.parameters(), lr=1e-2)
    losses = []
    for step in range(6):
        for net, opt in ((model, ours), (twin, ref)):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
        losses.append(loss.item())
        if step == 2:  # torch's state into ours, then ours into torch's: the names agree
            # (deep copies: load_state_dict keeps the very tensors when dtype and device match)
            ours.load_state_dict(copy.deepcopy(ref.state_dict()))
            ref.load_state_dict(copy.deepcopy(ours.state_dict()))
    assert losses[-1] < losses[0]
    # 6 steps, as the 100-step test
    assert rel_err(_flat(model.parameters()), _flat(twin.parameters())) < 10 * U32 * math.sqrt(6)


def test_a_parameter_without_gradient_keeps_its_own_step_count():
    ps = _params(shapes=[(10,), (20,)])
    qs = [p.clone() for p in ps]
    ours, ref = Adam(ps, lr=0.1, config=CFG), torch.optim.Adam(qs, lr=0.1)
    for k in range(4):
        for i, (p, q) in enumerate(zip(ps, qs, strict=True)):
            if i == 1 and k < 2:  # the second tensor gets no gradient in the first two steps
                p.grad = q.grad = None
            else:
                g = torch.full(p.shape, float(k + 1), device=DEVICE)
                p.grad, q.grad = g, g.clone()
        ours.step()
        ref.step()
    assert [int(s["step"]) for s in ours.state.values()] == [4, 2]
    assert rel_err(_flat(ps), _flat(qs)) < 10 * U32


def test_bf16_parameters_keep_fp32_state():
    ps = _params(torch.bfloat16, [(300,)])
    opt = Adam(ps, lr=1e-2, config=CFG)
    ps[0].grad = torch.ones_like(ps[0])
    opt.step()
    st = opt.state[ps[0]]
    assert ps[0].dtype == torch.bfloat16 and st["exp_avg"].dtype == torch.float32
    assert torch.allclose(st["exp_avg"], torch.full_like(st["exp_avg"], 0.1))


@pytest.mark.parametrize("ours_cls, torch_cls, kwargs", [
    (SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
    (Adam, torch.optim.Adam, dict(lr=0.1)),
])
def test_step_plan_is_reused_until_a_gradient_changes(ours_cls, torch_cls, kwargs):
    """step() caches its checks and launch tables per group; every change that matters must
    rebuild them, and every step must match torch.optim fed the same gradients."""
    ps = _params(shapes=[(300,), (7,), (5, 7)])
    qs = [p.clone() for p in ps]
    ours, ref = ours_cls(ps, **kwargs, config=CFG), torch_cls(qs, **kwargs)
    gen = torch.Generator().manual_seed(1)

    def new_grad(i):
        g = torch.randn(ps[i].shape, generator=gen).to(DEVICE)
        ps[i].grad, qs[i].grad = g, g.clone()

    def step():
        ours.step()
        ref.step()
        return ours._plans.get(id(ours.param_groups[0]))

    for i in range(3):
        new_grad(i)
    step()  # SGD: creates the momentum buffers, so nothing is cached yet
    plan = step()
    assert plan is not None and step() is plan  # nothing changed: the cached plan runs
    for p, q in zip(ps, qs, strict=True):  # written in place (backward into kept grads): kept
        p.grad.mul_(-2.0)
        q.grad.mul_(-2.0)
    assert step() is plan
    new_grad(1)  # a gradient replaced by a new tensor
    assert step() is not plan
    plan = step()
    with torch.no_grad():  # same gradient object, new storage: moved, so rebuilt
        ps[0].grad.data = torch.randn(ps[0].shape, generator=gen).to(DEVICE)
        qs[0].grad.copy_(ps[0].grad)
    assert step() is not plan
    plan = step()
    ps[2].grad = qs[2].grad = None  # no gradient: left alone (Adam: its step count waits)
    frozen = ps[2].clone()
    assert step() is not plan
    plan = step()
    assert step() is plan and torch.equal(ps[2], frozen)
    if ours_cls is Adam:  # a step count changed in place is seen, too
        for opt, p in ((ours, ps[0]), (ref, qs[0])):
            opt.state[p]["step"].fill_(1.0)
        assert step() is not plan
        counts = [int(s["step"]) for s in ours.state.values()]
        assert counts == [int(s["step"]) for s in ref.state.values()] and counts[0] == 2
    new_grad(2)
    step()
    assert rel_err(_flat(ps), _flat(qs)) < 10 * U32 * math.sqrt(13)  # 13 steps


@pytest.mark.parametrize("cls", [SGD, Adam])
def test_step_plan_sees_a_parameter_change_dtype_or_device(cls):
    w = torch.nn.Parameter(torch.zeros(300, device=DEVICE))
    w.grad = torch.ones_like(w)
    opt = cls([w], lr=0.1, config=CFG)
    opt.step()
    opt.step()
    assert opt._plans  # cached
    w.data = w.data.bfloat16()  # same parameter and gradient objects; the parameter moved
    with pytest.raises(TypeError, match=r"grads\[0\] must have dtype in \(bfloat16\), got float32"):
        opt.step()
    w.grad = torch.ones_like(w)
    before = w.detach().float().clone()
    opt.step()  # a bf16 step on the fp32 state
    assert w.dtype == torch.bfloat16 and bool(torch.all(w.float() < before))
    assert all(t.dtype == torch.float32 for t in opt.state[w].values() if t.numel() > 1)
    other = "cpu" if ON_GPU else "meta"  # Module.to() with swap_module_params_on_conversion
    torch.utils.swap_tensors(w, torch.nn.Parameter(w.detach().to(other)))
    w.grad = torch.ones_like(w)
    with pytest.raises(ValueError, match=r"params\[0\] is on (cpu|meta)"):
        opt.step()


# ---------------------------------------------------------------- refusals


def test_refusals():
    p = torch.zeros(4, device=DEVICE)
    with pytest.raises(TypeError,
                       match=r"params\[0\] must have dtype in \(float32, bfloat16\), got float64"):
        sgd_step_([p.double()], [p.double()], lr=0.1, config=CFG)
    with pytest.raises(TypeError, match=r"params\[0\] must have dtype .* got float16"):
        adam_step_([p.half()], [p.half()], [p], [p], step=1, lr=0.1, config=CFG)
    with pytest.raises(TypeError, match=r"grads\[0\] must have dtype in \(float32\), got bfloat16"):
        sgd_step_([p], [p.bfloat16()], lr=0.1, config=CFG)
    with pytest.raises(TypeError,
                       match=r"exp_avgs\[0\] must have dtype in \(float32\), got bfloat16"):
        adam_step_([p.bfloat16()], [p.bfloat16()], [p.bfloat16()], [p], step=1, lr=0.1, config=CFG)
    with pytest.raises(ValueError, match=r"grads\[0\] is on meta, expected"):
        sgd_step_([p], [torch.zeros(4, device="meta")], lr=0.1, config=CFG)
    with pytest.raises(ValueError, match=r"grads\[0\] has shape \(5,\), params\[0\] has \(4,\)"):
        sgd_step_([p], [torch.zeros(5, device=DEVICE)], lr=0.1, config=CFG)
    with pytest.raises(ValueError, match=r"params\[0\] must be contiguous"):
        sgd_step_([torch.zeros(4, 4, device=DEVICE).t()], [torch.zeros(4, 4, device=DEVICE)],
                  lr=0.1, config=CFG)
    with pytest.raises(ValueError, match="grads has 2 tensors, params has 1"):
        sgd_step_([p], [p, p], lr=0.1, config=CFG)
    with pytest.raises(ValueError, match="momentum_buffers are required"):
        sgd_step_([p], [p], lr=0.1, momentum=0.9, config=CFG)
    with pytest.raises(ValueError, match="max_exp_avg_sqs are required"):
        adam_step_([p], [p], [p], [p], step=1, lr=0.1, amsgrad=True, config=CFG)
    with pytest.raises(ValueError, match="step counts from 1"):
        adam_step_([p], [p], [p], [p], step=0, lr=0.1, config=CFG)
    with pytest.raises(TypeError,
                       match=r"grads\[0\] is sparse: sparse gradients are not supported"):
        sgd_step_([p], [torch.zeros(4, device=DEVICE).to_sparse()], lr=0.1, config=CFG)
    other = "cpu" if ON_GPU else "meta"
    with pytest.raises(ValueError, match=r"params\[0\] is on (cpu|meta)"):
        sgd_step_([torch.zeros(4, device=other)], [torch.zeros(4, device=other)], lr=0.1,
                  config=CFG)


@pytest.mark.parametrize("kind, bad, exc, match", [
    ("sgd", dict(lr=-0.1), ValueError, r"lr must be a finite number >= 0, got -0\.1"),
    ("sgd", dict(lr=math.nan), ValueError, r"lr must be a finite number >= 0, got nan"),
    ("sgd", dict(lr="0.1"), TypeError, r"lr must be a real number, got str"),
    ("sgd", dict(lr=math.inf), ValueError, r"lr must be a finite number >= 0, got inf"),
    ("adam", dict(lr=torch.tensor(1e-3)), TypeError, r"lr must be a real number, got Tensor"),
    ("sgd", dict(momentum=-0.9), ValueError, r"momentum must be a finite number >= 0, got -0\.9"),
    ("sgd", dict(dampening=1.5), ValueError, r"dampening must be in \[0, 1\], got 1\.5"),
    ("sgd", dict(dampening=-0.1), ValueError, r"dampening must be in \[0, 1\], got -0\.1"),
    ("sgd", dict(weight_decay=-1e-2), ValueError,
     r"weight_decay must be a finite number >= 0, got -0\.01"),
    ("adam", dict(lr=-1e-3), ValueError, r"lr must be a finite number >= 0, got -0\.001"),
    ("adam", dict(beta1=1.0), ValueError, r"beta1 must be in \[0, 1\), got 1\.0"),
    ("adam", dict(beta1=-0.1), ValueError, r"beta1 must be in \[0, 1\), got -0\.1"),
    ("adam", dict(beta2=1.5), ValueError, r"beta2 must be in \[0, 1\), got 1\.5"),
    ("adam", dict(beta2=math.nan), ValueError, r"beta2 must be in \[0, 1\), got nan"),
    ("adam", dict(eps=-1e-8), ValueError, r"eps must be a finite number >= 0, got -1e-08"),
    ("adam", dict(weight_decay=-0.1, decoupled_weight_decay=True), ValueError,
     r"weight_decay must be a finite number >= 0, got -0\.1"),
    ("adam", dict(step=2.5), TypeError, r"step must be an int, got float"),
    ("adam", dict(step=-3), ValueError, r"step counts from 1, got -3"),
])
def test_hyper_parameter_refusals(kind, bad, exc, match):
    p = torch.ones(4, device=DEVICE)
    before = p.clone()
    state = [torch.zeros_like(p) for _ in range(2)]
    with pytest.raises(exc, match=match):
        if kind == "sgd":
            sgd_step_([p], [p.clone()], state[:1], **{"lr": 0.1, "momentum": 0.9, **bad},
                      config=CFG)
        else:
            adam_step_([p], [p.clone()], state[:1], state[1:], **{"step": 1, "lr": 0.1, **bad},
                       config=CFG)
    assert torch.equal(p, before) and all(torch.all(t == 0) for t in state)  # nothing ran


def test_boundary_hyper_parameters_are_accepted():
    """beta1 = beta2 = eps = 0, dampening = 1 and a NumPy integer step are in range and give the
    float64 references' step."""
    p, g = _params(shapes=[(7,)])[0], _params(shapes=[(7,)], seed=1)[0]
    p64, g64 = _f64([p, g])
    m, v = torch.full_like(p, 0.5), torch.full_like(p, 0.25)
    hyper = dict(lr=0.1, beta1=0.0, beta2=0.0, eps=0.0)
    with np.errstate(invalid="ignore"):  # eps = 0: the interpreter's masked-off lanes do 0 / 0
        adam_step_([p], [g], [m], [v], step=np.int64(3), config=CFG, **hyper)
    want = adam_update(p64, g64, 0 * p64 + 0.5, 0 * p64 + 0.25, 3, **hyper)[0]
    assert rel_err(p, want) < 10 * U32
    q, b = _params(shapes=[(7,)], seed=2)[0], torch.full_like(p, 0.5)
    q64 = _f64([q])[0]
    sgd_step_([q], [g], [b], lr=0.1, momentum=0.9, dampening=1.0, config=CFG)
    want, buf = sgd_update(q64, g64, 0 * q64 + 0.5, lr=0.1, momentum=0.9, dampening=1.0)
    assert rel_err(q, want) < 10 * U32 and rel_err(b, buf) < 10 * U32


def test_optimizer_refusals():
    w = torch.nn.Parameter(torch.zeros(4, device=DEVICE))
    with pytest.raises(ValueError, match="Invalid learning rate"):
        SGD([w], lr=-1.0)
    with pytest.raises(ValueError, match="Nesterov momentum requires"):
        SGD([w], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="Invalid momentum value"):
        SGD([w], lr=0.1, momentum=-0.9)
    with pytest.raises(ValueError, match="Invalid weight_decay value"):
        SGD([w], lr=0.1, weight_decay=-1e-2)
    with pytest.raises(ValueError, match="Invalid beta parameter at index 1"):
        Adam([w], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="Invalid beta parameter at index 0"):
        AdamW([w], betas=(1.0, 0.999))
    with pytest.raises(ValueError, match="Invalid epsilon value"):
        Adam([w], eps=-1e-8)
    with pytest.raises(ValueError, match="Invalid weight_decay value"):
        AdamW([w], weight_decay=-0.1)
    with pytest.raises(ValueError, match="differentiable=True is not supported"):
        AdamW([w], differentiable=True)
    with pytest.raises(ValueError, match="capturable=True is not supported"):
        Adam([w], capturable=True)
    emb = torch.nn.Embedding(10, 3, sparse=True).to(DEVICE)
    emb(torch.tensor([1, 2], device=DEVICE)).sum().backward()
    for cls in (SGD, Adam):
        with pytest.raises(TypeError, match="does not support sparse gradients"):
            cls(emb.parameters(), lr=0.1, config=CFG).step()
    mixed = [torch.nn.Parameter(torch.zeros(4, device=DEVICE)),
             torch.nn.Parameter(torch.zeros(4, device=DEVICE).bfloat16())]
    for m in mixed:
        m.grad = torch.ones_like(m)
    SGD(mixed, lr=0.1, config=CFG).step()  # fp32 and bf16 in one group: one launch each
    assert torch.all(mixed[0] == -0.1) and torch.all(mixed[1] == torch.tensor(-0.1).bfloat16())


# ---------------------------------------------------------------- GPU: full size


@pytest.mark.gpu
def test_gpu_full_size_adam_and_sgd_match_torch_fused_on_a_model_shaped_list():
    shapes = [(50257, 64), (1024, 64)] + [(64, 64), (64,), (256, 64), (64, 256), (256,)] * 40
    for ours_cls, torch_cls, kw in ((Adam, torch.optim.Adam, dict(lr=1e-3, weight_decay=1e-2)),
                                    (SGD, torch.optim.SGD, dict(lr=1e-2, momentum=0.9))):
        ps = _params(torch.float32, shapes)
        qs = [p.clone() for p in ps]
        ours, ref = ours_cls(ps, **kw), torch_cls(qs, fused=True, **kw)  # config=None: tuned
        for _ in range(10):
            for p, q in zip(ps, qs, strict=True):
                p.grad = torch.randn_like(p)
                q.grad = p.grad.clone()
            ours.step()
            ref.step()
        assert rel_err(_flat(ps), _flat(qs)) < 10 * U32 * math.sqrt(10)


@pytest.mark.gpu
def test_gpu_one_big_tensor_and_the_table_cache():
    from kernelnotes.gd import kernel

    n = (1 << 26) + 3
    p = torch.randn(n, device="cuda")
    q = p.clone()
    g = torch.randn(n, device="cuda")
    ms, vs = [torch.zeros_like(p)], [torch.zeros_like(p)]
    ref = torch.optim.Adam([q], lr=1e-3, fused=True)
    q.grad = g
    for k in range(1, 4):
        adam_step_([p], [g], ms, vs, step=k, lr=1e-3, config=CFG)
        ref.step()
    assert rel_err(p, q) < 10 * U32
    built = [key for key in kernel._TABLES if any(e[2] == (n,) for e in key[1])]
    assert len(built) == 1  # three steps, one table: built once, then reused


@pytest.mark.parametrize("ours, theirs", [(SGD, torch.optim.SGD), (Adam, torch.optim.Adam),
                                          (AdamW, torch.optim.AdamW)])
def test_same_arguments_and_defaults_as_torch_optim(ours, theirs):
    import inspect

    a, b = inspect.signature(ours).parameters, inspect.signature(theirs).parameters
    for name, par in b.items():
        assert name in a, name
        assert a[name].default == par.default and a[name].kind == par.kind, name
    assert set(a) - set(b) == {"config"}


def test_lr_schedulers_drive_the_fused_step():
    ps, qs = _params(shapes=[(50,)]), _params(shapes=[(50,)])
    ours, ref = SGD(ps, lr=0.5, momentum=0.9, config=CFG), torch.optim.SGD(qs, lr=0.5, momentum=0.9)
    sched = [torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=4) for o in (ours, ref)]
    for _ in range(4):
        for p, q in zip(ps, qs, strict=True):
            p.grad = torch.ones_like(p)
            q.grad = p.grad.clone()
        ours.step()
        ref.step()
        for s in sched:
            s.step()
    assert ours.param_groups[0]["lr"] == ref.param_groups[0]["lr"]
    assert rel_err(_flat(ps), _flat(qs)) < 10 * U32 * math.sqrt(4)
# ---------------------------------------------------------------- bad input, tabled


def _t(*shape, dtype=torch.float32, device=DEVICE, **kw):
    return torch.ones(shape, dtype=dtype, device=device, **kw)


def _sgd_args(**over):
    """sgd_step_ with momentum on one 4-element tensor; ``over`` replaces any argument."""
    args = dict(params=[_t(4)], grads=[_t(4)], momentum_buffers=[_t(4)], lr=0.1, momentum=0.9,
                config=CFG)
    args.update(over)
    return args


def _adam_args(**over):
    args = dict(params=[_t(4)], grads=[_t(4)], exp_avgs=[_t(4)], exp_avg_sqs=[_t(4)], step=1,
                lr=0.1, config=CFG)
    args.update(over)
    return args


def _sparse():
    return torch.zeros(4, device=DEVICE).to_sparse()


OTHER = "cpu" if ON_GPU else "meta"  # a device the kernels can't run on
NONCONTIG = lambda: torch.ones(4, 4, device=DEVICE).t()  # noqa: E731
# (kind of bad input, keyword overrides, expected exception or None = handled as torch, match)
SGD_STEP_BAD = [
    ("wrong dtype", dict(params=[_t(4, dtype=torch.float64)], grads=[_t(4, dtype=torch.float64)],
                         momentum_buffers=[_t(4, dtype=torch.float64)]), TypeError, r"params\[0\]"),
    ("mixed dtypes", dict(grads=[_t(4, dtype=torch.bfloat16)]), TypeError, r"grads\[0\]"),
    ("mismatched shapes", dict(grads=[_t(5)]), ValueError, r"grads\[0\]"),
    ("list lengths differ", dict(grads=[_t(4), _t(4)]), ValueError, "grads"),
    ("empty lists", dict(params=[], grads=[], momentum_buffers=[]), None, None),
    ("non-contiguous", dict(params=[NONCONTIG()], grads=[_t(4, 4)], momentum_buffers=[_t(4, 4)]),
     ValueError, r"params\[0\]"),
    ("NaN/inf gradient", dict(grads=[torch.tensor([1.0, math.nan, math.inf, -math.inf],
                                                  device=DEVICE)]), None, None),
    ("wrong device", dict(grads=[_t(4, device=OTHER)]), ValueError, r"grads\[0\]"),
    ("sparse gradient", dict(grads=[_sparse()]), TypeError, r"grads\[0\]"),
    ("invalid option: momentum without buffers", dict(momentum_buffers=None), ValueError,
     "momentum_buffers"),
    ("non-finite hyperparameter: lr=nan", dict(lr=math.nan), ValueError, "lr"),
    ("non-finite hyperparameter: dampening=nan", dict(dampening=math.nan), ValueError,
     "dampening"),
    ("non-bool flag: nesterov='yes'", dict(nesterov="yes"), TypeError, "nesterov"),
    ("non-bool flag: first_step=1", dict(first_step=1), TypeError, "first_step"),
    ("params not a list", dict(params=_t(4)), TypeError, "params"),
    ("config not a triton.Config", dict(config={"BLOCK": 128}), TypeError, "config"),
    ("requires_grad in grad mode", dict(params=[_t(4, requires_grad=True)]), RuntimeError,
     "sgd_step_"),
]
ADAM_STEP_BAD = [
    ("wrong dtype", dict(params=[_t(4, dtype=torch.float16)], grads=[_t(4, dtype=torch.float16)]),
     TypeError, r"params\[0\]"),
    ("mixed dtypes", dict(exp_avgs=[_t(4, dtype=torch.bfloat16)]), TypeError, r"exp_avgs\[0\]"),
    ("mismatched shapes", dict(exp_avg_sqs=[_t(2, 2)]), ValueError, r"exp_avg_sqs\[0\]"),
    ("list lengths differ", dict(exp_avgs=[]), ValueError, "exp_avgs"),
    ("empty lists", dict(params=[], grads=[], exp_avgs=[], exp_avg_sqs=[]), None, None),
    ("non-contiguous", dict(params=[_t(4, 4)], grads=[_t(4, 4)], exp_avgs=[NONCONTIG()],
                            exp_avg_sqs=[_t(4, 4)]), ValueError, r"exp_avgs\[0\]"),
    ("NaN/inf gradient", dict(grads=[torch.tensor([1.0, math.nan, math.inf, -math.inf],
                                                  device=DEVICE)]), None, None),
    ("wrong device", dict(exp_avg_sqs=[_t(4, device=OTHER)]), ValueError, r"exp_avg_sqs\[0\]"),
    ("invalid option: amsgrad without max_exp_avg_sqs", dict(amsgrad=True), ValueError,
     "max_exp_avg_sqs"),
    ("non-finite hyperparameter: eps=nan", dict(eps=math.nan), ValueError, "eps"),
    ("non-finite hyperparameter: weight_decay=nan", dict(weight_decay=math.nan), ValueError,
     "weight_decay"),
    ("non-finite hyperparameter: beta1=inf", dict(beta1=math.inf), ValueError, "beta1"),
    ("invalid option: step=0", dict(step=0), ValueError, "step"),
    ("invalid option: step=2.5", dict(step=2.5), TypeError, "step"),
    ("non-bool flag: amsgrad='yes'", dict(amsgrad="yes", max_exp_avg_sqs=[_t(4)]), TypeError,
     "amsgrad"),
    ("params not a list", dict(params=_t(4)), TypeError, "params"),
    ("requires_grad in grad mode", dict(params=[_t(4, requires_grad=True)]), RuntimeError,
     "adam_step_"),
]


def _torch_functional(kind, args):
    """What torch.optim's own step does with the same inputs (fp32 copies, for-loop path)."""
    import importlib

    functional = importlib.import_module(f"torch.optim.{kind}")
    ps = [p.detach().clone() for p in args["params"]]
    with torch.no_grad():
        if kind == "sgd":
            bufs = [None] * len(ps) if args.get("first_step") else [b.clone() for b in
                                                                   args["momentum_buffers"]]
            functional.sgd(ps, list(args["grads"]), bufs, foreach=False,
                                weight_decay=0.0, momentum=args["momentum"], lr=args["lr"],
                                dampening=0.0, nesterov=False, maximize=False)
        else:
            steps = [torch.tensor(float(args["step"] - 1)) for _ in ps]
            functional.adam(ps, list(args["grads"]), [m.clone() for m in args["exp_avgs"]],
                                  [v.clone() for v in args["exp_avg_sqs"]], [], steps,
                                  foreach=False, amsgrad=False, beta1=0.9, beta2=0.999,
                                  lr=args["lr"], weight_decay=0.0, eps=1e-8, maximize=False)
    return ps


@pytest.mark.parametrize("kind, over, exc, match",
                         [("sgd", *row[1:]) for row in SGD_STEP_BAD]
                         + [("adam", *row[1:]) for row in ADAM_STEP_BAD],
                         ids=[f"sgd_step_: {r[0]}" for r in SGD_STEP_BAD]
                         + [f"adam_step_: {r[0]}" for r in ADAM_STEP_BAD])
def test_step_functions_bad_input_table(kind, over, exc, match):
    args = (_sgd_args if kind == "sgd" else _adam_args)(**over)
    fn = sgd_step_ if kind == "sgd" else adam_step_
    params = args["params"]
    before = [p.detach().clone() for p in params] if isinstance(params, list) else None
    if exc is not None:
        with pytest.raises(exc, match=match):
            fn(**args)
        if before is not None:  # refused before anything ran
            assert all(torch.equal(p.detach(), b) for p, b in zip(params, before, strict=True))
        return
    want = _torch_functional(kind, args)
    with np.errstate(invalid="ignore"):  # inf - inf in the interpreter's NumPy
        fn(**args)
    for p, w in zip(params, want, strict=True):
        assert torch.equal(p.isnan(), w.isnan()) and torch.equal(p.isinf(), w.isinf())
        fin = w.isfinite()
        assert rel_err(p[fin], w[fin]) < 10 * U32


def _w(dtype=torch.float32, shape=(4,)):
    return [torch.nn.Parameter(torch.zeros(shape, dtype=dtype, device=DEVICE))]


# (kind of bad input, class, keyword overrides, expected exception or None = as torch, match)
OPTIM_BAD = [
    ("non-finite hyperparameter: lr=nan", "SGD", dict(lr=math.nan), ValueError, "lr"),
    ("negative lr", "SGD", dict(lr=-1.0), ValueError, "lr"),
    ("non-finite hyperparameter: momentum=nan", "SGD", dict(momentum=math.nan), ValueError,
     "momentum"),
    ("non-finite hyperparameter: weight_decay=inf", "SGD", dict(weight_decay=math.inf),
     ValueError, "weight_decay"),
    ("non-finite hyperparameter: dampening=nan", "SGD", dict(momentum=0.9, dampening=math.nan),
     ValueError, "dampening"),
    ("invalid option: nesterov without momentum", "SGD", dict(nesterov=True), ValueError,
     "(?i)nesterov"),
    ("non-bool flag: nesterov='yes'", "SGD", dict(momentum=0.9, nesterov="yes"), TypeError,
     "nesterov"),
    ("non-bool flag: maximize=1", "SGD", dict(maximize=1), TypeError, "maximize"),
    ("non-bool flag: foreach='no'", "SGD", dict(foreach="no"), TypeError, "foreach"),
    ("Tensor lr of 2 elements", "SGD", dict(lr=torch.tensor([0.1, 0.2])), ValueError, "lr"),
    ("wrong dtype", "SGD", dict(params=_w(torch.float64)), TypeError, "params"),
    ("empty parameter list", "SGD", dict(params=[]), ValueError, "empty parameter list"),
    ("params a bare tensor", "SGD", dict(params=_w()[0]), TypeError, "params"),
    ("unsupported option: differentiable=True", "SGD", dict(differentiable=True), ValueError,
     "differentiable"),
    ("non-finite hyperparameter: lr=nan", "Adam", dict(lr=math.nan), ValueError, "lr"),
    ("non-finite hyperparameter: lr=inf", "Adam", dict(lr=math.inf), ValueError, "lr"),
    ("non-finite hyperparameter: eps=nan", "Adam", dict(eps=math.nan), ValueError, "eps"),
    ("non-finite hyperparameter: weight_decay=nan", "Adam", dict(weight_decay=math.nan),
     ValueError, "weight_decay"),
    ("betas of wrong length", "Adam", dict(betas=(0.9,)), ValueError, "betas"),
    ("non-finite hyperparameter: betas=(0.9, nan)", "Adam", dict(betas=(0.9, math.nan)),
     ValueError, "betas"),
    ("betas not numbers", "Adam", dict(betas=("a", "b")), TypeError, "betas"),
    ("beta1 = 1", "Adam", dict(betas=(1.0, 0.999)), ValueError, "betas"),
    ("non-bool flag: amsgrad='yes'", "Adam", dict(amsgrad="yes"), TypeError, "amsgrad"),
    ("non-bool flag: decoupled_weight_decay=1", "Adam", dict(decoupled_weight_decay=1),
     TypeError, "decoupled_weight_decay"),
    ("unsupported option: capturable=True", "Adam", dict(capturable=True), ValueError,
     "capturable"),
    ("wrong dtype", "Adam", dict(params=_w(torch.float16)), TypeError, "params"),
    ("empty parameter list", "Adam", dict(params=[]), ValueError, "empty parameter list"),
    ("non-finite hyperparameter: lr=nan", "AdamW", dict(lr=math.nan), ValueError, "lr"),
    ("non-finite hyperparameter: eps=nan", "AdamW", dict(eps=math.nan), ValueError, "eps"),
    ("non-finite hyperparameter: weight_decay=nan", "AdamW", dict(weight_decay=math.nan),
     ValueError, "weight_decay"),
    ("betas of wrong length", "AdamW", dict(betas=(0.9, 0.99, 0.9)), ValueError, "betas"),
    ("negative eps", "AdamW", dict(eps=-1e-8), ValueError, "eps"),
    ("non-bool flag: maximize='no'", "AdamW", dict(maximize="no"), TypeError, "maximize"),
    ("Tensor lr of 2 elements", "AdamW", dict(lr=torch.tensor([0.1, 0.2])), ValueError, "lr"),
    ("wrong dtype", "AdamW", dict(params=_w(torch.float64)), TypeError, "params"),
    ("unsupported option: differentiable=True", "AdamW", dict(differentiable=True), ValueError,
     "differentiable"),
    ("params a bare tensor", "AdamW", dict(params=_w()[0]), TypeError, "params"),
]
_CLASSES = {"SGD": SGD, "Adam": Adam, "AdamW": AdamW}


@pytest.mark.parametrize("cls, over, exc, match", [row[1:] for row in OPTIM_BAD],
                         ids=[f"{r[1]}: {r[0]}" for r in OPTIM_BAD])
def test_optimizers_bad_input_table(cls, over, exc, match):
    """Refused at construction, as torch.optim refuses its own bad hyperparameters (and more)."""
    kwargs = dict(params=_w(), lr=0.1, config=CFG)
    kwargs.update(over)
    params = kwargs.pop("params")
    with pytest.raises(exc, match=match):
        _CLASSES[cls](params, **kwargs)


@pytest.mark.parametrize("cls", ["SGD", "Adam", "AdamW"])
@pytest.mark.parametrize("kind", ["0-d parameter", "NaN/inf gradient", "empty parameter",
                                  "sparse gradient"])
def test_optimizers_bad_input_at_step(cls, kind):
    """What only a step can see: handled as torch.optim handles it, or refused by name."""
    shape = () if kind == "0-d parameter" else (0,) if kind == "empty parameter" else (4,)
    ours = _w(shape=shape)
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    if kind == "sparse gradient":
        ours[0].grad = _sparse()
        with pytest.raises(TypeError, match="(?i)sparse"):
            _CLASSES[cls](ours, lr=0.1, config=CFG).step()
        return
    g = (torch.tensor([1.0, math.nan, math.inf, -math.inf], device=DEVICE)
         if kind == "NaN/inf gradient" else torch.ones(shape, device=DEVICE))
    ours[0].grad, theirs[0].grad = g, g.clone()
    kw = dict(lr=0.1, momentum=0.9) if cls == "SGD" else dict(lr=0.1)
    with np.errstate(invalid="ignore"):
        _CLASSES[cls](ours, **kw, config=CFG).step()
    getattr(torch.optim, cls)(theirs, **kw).step()
    p, q = ours[0].detach(), theirs[0].detach()
    assert p.shape == q.shape
    assert torch.equal(p.isnan(), q.isnan()) and torch.equal(p.isinf(), q.isinf())
    assert rel_err(p[q.isfinite()], q[q.isfinite()]) < 10 * U32


# ---------------------------------------------------------------- custom operators


def _op_inputs(kind, seed=0):
    """Tiny inputs for one op call: two tensors (one leaves a masked tail), fresh state."""
    ps, gs = _params(shapes=[(CFG.kwargs["BLOCK"] + 3,), (2, 3)], seed=seed), _params(
        shapes=[(CFG.kwargs["BLOCK"] + 3,), (2, 3)], seed=seed + 1)
    states = [[torch.rand(p.shape, device=DEVICE) for p in ps] for _ in range(3)]
    if kind == "sgd":
        return (ps, gs, states[0], 0.1, 0.9, 0.1, 0.01, True, False, False)
    return (ps, gs, states[0], states[1], states[2], 3, 0.01, 0.9, 0.99, 1e-8, 0.1, True, True,
            False)


def _cfg_ints():
    return (CFG.kwargs["BLOCK"], CFG.kwargs["ITERS"], CFG.num_warps)


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_opcheck(kind):
    op = torch.ops.kernelnotes.sgd_step_ if kind == "sgd" else torch.ops.kernelnotes.adam_step_
    torch.library.opcheck(op, (*_op_inputs(kind), *_cfg_ints()))


def _call(kind, ps, gs, states, step=3):
    """A function a user would write: the public step (which calls the op), then a loss."""
    if kind == "sgd":
        sgd_step_(ps, gs, states[0], lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01,
                  nesterov=False, config=CFG)
    else:
        adam_step_(ps, gs, states[0], states[1], states[2], step=step, lr=0.01, beta2=0.99,
                   weight_decay=0.1, decoupled_weight_decay=True, amsgrad=True, config=CFG)
    return sum(p.float().square().sum() for p in ps)


def _compiled_matches_eager(kind, backend):
    """torch.compile(fullgraph=True) of a function that calls the public step: two calls (the
    second with a new step count for Adam), the same parameters and state as eager, bit for bit
    (the op runs the same kernel), and the same loss up to the order of its sum (inductor
    generates its own reduction: within a few ulps of fp32)."""
    torch._dynamo.reset()  # a fresh cache: earlier compiles of _call must not count
    args = _op_inputs(kind)
    ps, gs, states = args[0], args[1], [list(t) for t in args[2:5] if isinstance(t, list)]
    eager = ([p.clone() for p in ps], [[t.clone() for t in s] for s in states])
    comp = ([p.clone() for p in ps], [[t.clone() for t in s] for s in states])
    f = torch.compile(_call, fullgraph=True, backend=backend)
    for step in (3, 4):
        want = _call(kind, eager[0], gs, eager[1], step)
        got = f(kind, comp[0], gs, comp[1], step)
        if backend == "aot_eager":
            assert torch.equal(got, want)
        else:
            # n positive terms summed in a tree (torch's and inductor's GPU reductions both are)
            # land within log2(n) u of the exact sum
            n = sum(p.numel() for p in ps)
            assert abs(got.item() - want.item()) <= 2 * math.log2(n) * U32 * want.item()
    for a, b in zip(eager[0] + sum(eager[1], []), comp[0] + sum(comp[1], []), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_compiled_function_calling_the_step_gives_eagers_result(kind):
    _compiled_matches_eager(kind, "aot_eager")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_gpu_compiled_step_with_inductor(kind):
    _compiled_matches_eager(kind, "inductor")


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_steps_run_under_fake_tensors(kind):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        ps = [torch.empty(300, device=DEVICE), torch.empty(2, 3, device=DEVICE,
                                                           dtype=torch.float32)]
        gs = [torch.empty_like(p) for p in ps]
        st = [[torch.empty_like(p) for p in ps] for _ in range(3)]
        _call(kind, ps, gs, st)
        assert [tuple(p.shape) for p in ps] == [(300,), (2, 3)]
        with pytest.raises(TypeError, match=r"grads\[1\]"):  # checks run on fake tensors too
            _call(kind, ps, [gs[0], gs[1].double()], st)


def test_step_functions_refuse_grad_but_run_under_no_grad():
    """No backward: a parameter that requires grad is refused in grad mode (never a silent
    in-place write behind autograd), and stepped under no_grad, as torch.optim does."""
    w = torch.nn.Parameter(torch.ones(4, device=DEVICE))
    with pytest.raises(RuntimeError, match=r"sgd_step_: params\[0\] requires grad"):
        sgd_step_([w], [torch.ones(4, device=DEVICE)], lr=0.5, config=CFG)
    with torch.no_grad():
        sgd_step_([w], [torch.ones(4, device=DEVICE)], lr=0.5, config=CFG)
    assert torch.equal(w.detach(), torch.full((4,), 0.5, device=DEVICE))


# ---------------------------------------------------------------- torch.optim's conventions


@pytest.mark.parametrize("ours_cls, torch_cls, kwargs", [
    (SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
    (Adam, torch.optim.Adam, dict(lr=0.1, amsgrad=True)),
    (AdamW, torch.optim.AdamW, dict(lr=0.1)),
])
def test_param_groups_and_state_dicts_behave_as_torchs(ours_cls, torch_cls, kwargs):
    """Same param-group keys and values; add_param_group with its own hyperparameters;
    changing lr, betas or weight decay mid-run; state dicts loaded either way (including
    through a pickle); the same parameters as torch.optim all along."""
    import io

    ps, qs = _params(shapes=[(20,)]), _params(shapes=[(20,)])
    ours, ref = ours_cls(ps, **kwargs, config=CFG), torch_cls(qs, **kwargs)
    strip = lambda sd: [{k: v for k, v in g.items()} for g in sd["param_groups"]]  # noqa: E731
    assert strip(ours.state_dict()) == strip(ref.state_dict())
    extra = {"lr": 0.05, "weight_decay": 0.01}
    more_p, more_q = _params(shapes=[(3, 5)], seed=3), _params(shapes=[(3, 5)], seed=3)
    ours.add_param_group({"params": more_p, **extra})
    ref.add_param_group({"params": more_q, **extra})
    with pytest.raises(ValueError, match="lr"):  # a group's own hyperparameters are checked
        ours.add_param_group({"params": _params(shapes=[(2,)]), "lr": math.nan})
    assert len(ours.param_groups) == 2
    gen = torch.Generator().manual_seed(5)
    for k in range(6):
        for p, q in zip(ps + more_p, qs + more_q, strict=True):
            g = torch.randn(p.shape, generator=gen).to(DEVICE)
            p.grad, q.grad = g, g.clone()
        if k == 2:  # hyperparameters changed by hand, as a scheduler or a user does
            for opt in (ours, ref):
                opt.param_groups[0]["lr"] *= 0.5
                opt.param_groups[1]["weight_decay"] = 0.0
                if "betas" in opt.param_groups[0]:
                    opt.param_groups[0]["betas"] = (0.8, 0.99)
        if k == 4:  # a round trip through torch.save, torch's state into ours and back
            buf = io.BytesIO()
            torch.save(ref.state_dict(), buf)
            buf.seek(0)
            ours.load_state_dict(torch.load(buf))
            ref.load_state_dict(copy.deepcopy(ours.state_dict()))
        ours.step()
        ref.step()
    assert strip(ours.state_dict()) == strip(ref.state_dict())
    sd_o, sd_r = ours.state_dict()["state"], ref.state_dict()["state"]
    assert sd_o.keys() == sd_r.keys()
    for i in sd_r:
        assert sd_o[i].keys() == sd_r[i].keys()
        for key in sd_r[i]:
            assert sd_o[i][key].dtype == sd_r[i][key].dtype
            assert sd_o[i][key].shape == sd_r[i][key].shape
    assert rel_err(_flat(ps + more_p), _flat(qs + more_q)) < 10 * U32 * math.sqrt(6)


@pytest.mark.parametrize("cls", [SGD, AdamW])
def test_an_optimizer_survives_deepcopy_and_an_old_state_dict(cls):
    """config travels through a pickle (torch's __getstate__ keeps only three keys), and a
    state dict whose groups lack the newer flags loads, as torch's __setstate__ allows."""
    w = torch.nn.Parameter(torch.zeros(4, device=DEVICE))
    opt = cls([w], lr=0.1, config=CFG)
    w.grad = torch.ones_like(w)
    opt.step()
    twin = copy.deepcopy(opt)
    assert twin.config.kwargs == CFG.kwargs
    w2 = twin.param_groups[0]["params"][0]
    w2.grad = torch.ones_like(w2)
    twin.step()
    sd = opt.state_dict()
    for g in sd["param_groups"]:
        g.pop("maximize"), g.pop("foreach"), g.pop("fused")
    opt.load_state_dict(sd)
    assert opt.param_groups[0]["maximize"] is False and opt.param_groups[0]["fused"] is None
    opt.step()
    assert torch.equal(w, twin.param_groups[0]["params"][0])


def test_adam_loads_a_step_saved_as_a_number():
    """Old state dicts keep ``step`` as a float: it becomes a float32 tensor on loading, as in
    torch.optim.Adam, and counting goes on from it."""
    w, q = (torch.nn.Parameter(torch.zeros(5, device=DEVICE)) for _ in range(2))
    ref = torch.optim.Adam([q], lr=0.1)
    q.grad = torch.ones_like(q)
    ref.step()
    sd = ref.state_dict()
    sd["state"][0]["step"] = 1.0
    opt = Adam([w], lr=0.1, config=CFG)
    opt.load_state_dict(sd)
    assert torch.is_tensor(opt.state[w]["step"]) and opt.state[w]["step"].dtype == torch.float32
    w.grad = torch.ones_like(w)
    opt.step()
    assert float(opt.state[w]["step"]) == 2.0
