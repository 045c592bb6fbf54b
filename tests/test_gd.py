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
    path = adam(lambda t: np.zeros_like(t), [2.0], 10, lr=0.1, weight_decay=0.5, decoupled=True)
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
    dict(lr=1e-2, weight_decay=0.1, decoupled=True, maximize=True, beta1=0.8, beta2=0.99, eps=1e-6),
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
    l2 = hyper.get("weight_decay", 0) != 0 and not hyper.get("decoupled", False)
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
    ("adam", dict(lr=1e-2, weight_decay=0.1, decoupled=True, maximize=True)),
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
        ref = torch.optim.Adam(qs, **{"decoupled_weight_decay" if k == "decoupled" else k: v
                                      for k, v in hyper.items()})
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
    l2 = hyper.get("weight_decay", 0) != 0 and not hyper.get("decoupled", False)
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
        kwargs = dict(kwargs, decoupled=True, weight_decay=1e-2)
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
    with pytest.raises(ValueError, match="non-empty list"):
        sgd_step_([], [], lr=0.1, config=CFG)
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
    ("adam", dict(weight_decay=-0.1, decoupled=True), ValueError,
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
