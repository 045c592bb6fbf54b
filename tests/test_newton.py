"""Newton's method: the reference solvers' math; the Triton sqrt/rsqrt against float64, as
custom operators (opcheck, fake tensors, torch.compile, gradients) and on bad input."""

from __future__ import annotations

import inspect
import math
import typing

import numpy as np
import pytest
import torch

from kernelnotes._testing import poison_, ulp_distance_f32
from kernelnotes.newton import (
    NoConvergenceError,
    NonFiniteError,
    RootFindingError,
    ZeroDerivativeError,
    bisection,
    convergence_order,
    halley,
    newton,
    newton_system,
    rsqrt,
    sqrt,
)
from kernelnotes.newton.kernel import BLOCK
from tests._machine import DEVICE, ON_GPU, size

f = lambda x: x * x - 2.0  # noqa: E731
df = lambda x: 2.0 * x  # noqa: E731
d2f = lambda x: 2.0  # noqa: E731
ROOT2 = math.sqrt(2.0)


# ---------------------------------------------------------------- reference: the math


def test_newton_is_quadratic_with_the_predicted_constant():
    e = np.abs(newton(f, df, 2.0) - ROOT2)
    e = e[e > 1e-14]  # rounding floor: beyond it the ratios are noise
    assert convergence_order(e)[-1] == pytest.approx(2.0, abs=0.05)
    # e_{n+1} / e_n^2 -> |f''(x*)| / (2 |f'(x*)|) = 1 / (2 sqrt 2)
    assert e[-1] / e[-2] ** 2 == pytest.approx(1 / (2 * ROOT2), rel=1e-3)


def test_halley_is_cubic():
    e = np.abs(halley(f, df, d2f, 3.0) - ROOT2)
    e = e[e > 1e-14]
    assert convergence_order(e)[-1] == pytest.approx(3.0, abs=0.1)


def test_bisection_halves_the_bracket_and_keeps_the_root_inside():
    a, b = 1.0, 2.0
    mids = bisection(f, a, b, tol=1e-12)
    k = np.arange(len(mids))
    assert np.all(np.abs(mids - ROOT2) <= (b - a) / 2 ** (k + 1))  # |m_k - x*| <= (b-a)/2^(k+1)
    assert len(mids) == math.ceil(math.log2((b - a) / 1e-12))


@pytest.mark.parametrize("m", [2, 3, 5])
def test_newton_at_a_root_of_multiplicity_m_is_linear_with_rate_1_minus_1_over_m(m):
    hist = newton(
        lambda x: (x - 1.0) ** m, lambda x: m * (x - 1.0) ** (m - 1), 2.0, tol=1e-10, max_iter=500
    )
    e = np.abs(hist - 1.0)
    assert np.allclose(e[1:20] / e[:19], 1 - 1 / m, rtol=1e-9)


def test_newton_system_converges_quadratically_to_the_circle_line_intersection():
    F = lambda v: np.array([v[0] ** 2 + v[1] ** 2 - 4.0, v[0] - v[1]])  # noqa: E731
    J = lambda v: np.array([[2 * v[0], 2 * v[1]], [1.0, -1.0]])  # noqa: E731
    hist = newton_system(F, J, np.array([1.0, 0.5]))
    e = np.linalg.norm(hist - ROOT2, axis=1)
    e = e[e > 1e-14]
    assert np.allclose(hist[-1], [ROOT2, ROOT2], atol=1e-15)
    assert convergence_order(e)[-1] == pytest.approx(2.0, abs=0.15)


# ---------------------------------------------------------------- reference: failures


def test_zero_derivative_is_refused_with_the_history():
    with pytest.raises(ZeroDerivativeError, match=r"f'\(x\) = 0 at x = 0.0") as err:
        newton(f, df, 0.0)
    assert err.value.history.tolist() == [0.0]


@pytest.mark.parametrize("x0", [0.0, 1e-20])
def test_halley_refuses_to_stall_at_a_zero_derivative(x0):
    # at f'(x0) = 0 Halley's step 2 f f' / (2 f'^2 - f f'') is 0 (at f' = 2e-20 it is 2e-20):
    # the step test alone would call x0 a root, though f(x0) = -2
    with pytest.raises(ZeroDerivativeError, match=r"Halley's step is tiny .* f\(x\) = -2.0") as err:
        halley(f, df, d2f, x0)
    assert err.value.history.tolist() == [x0]


@pytest.mark.parametrize("m", [2, 3])
def test_halley_residual_test_accepts_multiple_roots(m):
    # there Newton's step is shorter than Halley's, (m + 1) / (2m) of it: no false alarm
    hist = halley(
        lambda x: (x - 1.0) ** m,
        lambda x: m * (x - 1.0) ** (m - 1),
        lambda x: m * (m - 1) * (x - 1.0) ** (m - 2),
        2.0,
        tol=1e-12,
        max_iter=200,
    )
    assert abs(hist[-1] - 1.0) < 1e-10


def test_the_cycle_of_x3_minus_2x_plus_2_from_0():
    g, dg = (lambda x: x**3 - 2 * x + 2), (lambda x: 3 * x**2 - 2)
    with pytest.raises(NoConvergenceError, match="did not converge in 10 steps") as err:
        newton(g, dg, 0.0, max_iter=10)
    assert err.value.history.tolist() == [0.0, 1.0] * 5 + [0.0]


def test_divergence_from_a_poor_guess_is_stopped_and_reported():
    # arctan from 1.5: each tangent overshoots further, |x_n| grows until f'(x_n) underflows to 0
    with pytest.raises(RootFindingError) as err:
        newton(math.atan, lambda x: 1 / (1 + x * x), 1.5)
    grows = np.abs(err.value.history)
    assert np.all(np.diff(grows) > 0) and grows[-1] > 1e100
    assert np.abs(newton(math.atan, lambda x: 1 / (1 + x * x), 1.0)[-1]) < 1e-300  # good guess


def test_bisection_and_solver_refusals():
    with pytest.raises(ValueError, match="no sign change on"):
        bisection(f, 2.0, 3.0)
    with pytest.raises(NonFiniteError, match="must be finite"):
        bisection(lambda x: 1 / x if x else math.inf, 0.0, 1.0)
    with pytest.raises(NonFiniteError, match="x0 is nan"):
        newton(f, df, float("nan"))
    with pytest.raises(ValueError, match="need tol > 0"):
        newton(f, df, 1.0, tol=0.0)
    with pytest.raises(ValueError, match="errors must be >= 3 positive numbers"):
        convergence_order([1e-1, 1e-2])
    with pytest.raises(ValueError, match=r"J\(x\) must be \(2, 2\) and F\(x\) \(2,\), got \(2,\)"):
        newton_system(lambda v: v, lambda v: v, np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"x0 must be a 1-D vector, got shape \(1, 2\)"):
        newton_system(lambda v: v, lambda v: np.eye(2), np.array([[1.0, 2.0]]))


CIRCLE = lambda v: np.array([v[0] ** 2 + v[1] ** 2 - 4.0, v[0] - v[1]])  # noqa: E731
CIRCLE_J = lambda v: np.array([[2 * v[0], 2 * v[1]], [1.0, -1.0]])  # noqa: E731


def test_newton_system_refuses_a_singular_jacobian_as_newton_refuses_f_prime_0():
    # at (1, -1) the circle's gradient (2, -2) is parallel to the line's (1, -1): J is singular
    x0 = np.array([1.0, -1.0])
    assert np.linalg.matrix_rank(CIRCLE_J(x0)) == 1
    match = r"J\(x\) is singular at x = \[1.0, -1.0\]"
    with pytest.raises(ZeroDerivativeError, match=match) as err:
        newton_system(CIRCLE, CIRCLE_J, x0)
    assert err.value.history.shape == (1, 2) and np.array_equal(err.value.history[0], x0)


def test_newton_system_stops_at_nonfinite_values_with_the_history():
    # Newton on sqrt(x) - 2 from 25 overshoots to 25 - (5 - 2) * 2 * 5 = -5, where sqrt is NaN
    F = lambda v: np.array([np.sqrt(v[0]) - 2.0, v[1]])  # noqa: E731
    J = lambda v: np.array([[0.5 / np.sqrt(v[0]), 0.0], [0.0, 1.0]])  # noqa: E731
    x0 = np.array([25.0, 1.0])
    x1 = x0 - np.linalg.solve(J(x0), F(x0))
    assert x1[0] < 0
    with pytest.raises(NonFiniteError, match=r"F\(x\) is \[nan") as err:
        with np.errstate(invalid="ignore", divide="ignore"):  # sqrt(-5) in F and J
            newton_system(F, J, x0)
    assert err.value.history.shape == (2, 2) and np.array_equal(err.value.history, [x0, x1])
    # an inf in J(x) is refused too: the solve would give a finite (zero) step along it
    J_inf = lambda v: np.array([[np.inf, 0.0], [0.0, 1.0]])  # noqa: E731
    with pytest.raises(NonFiniteError, match=r"J\(x\) is \[\[inf") as err:
        newton_system(F, J_inf, x0)
    assert err.value.history.shape == (1, 2)
    with pytest.raises(NonFiniteError, match=r"x0 is \[nan") as err:
        newton_system(CIRCLE, CIRCLE_J, np.array([np.nan, 1.0]))
    assert err.value.history.shape == (1, 2)


def test_newton_system_no_convergence_and_stopping_rule_checks():
    match = r"did not converge in 2 steps \(tol=1e-15\)"
    with pytest.raises(NoConvergenceError, match=match) as err:
        newton_system(CIRCLE, CIRCLE_J, np.array([1.0, 0.5]), max_iter=2)
    full = newton_system(CIRCLE, CIRCLE_J, np.array([1.0, 0.5]))
    assert err.value.history.shape == (3, 2) and np.array_equal(err.value.history, full[:3])
    for tol, max_iter in [(0.0, 50), (-1.0, 50), (1e-15, 0)]:
        with pytest.raises(ValueError, match=rf"need tol > 0 and max_iter >= 1, got tol={tol}"):
            newton_system(CIRCLE, CIRCLE_J, np.array([1.0, 0.5]), tol=tol, max_iter=max_iter)


# ---------------------------------------------------------------- Triton sqrt / rsqrt


def _sweep_bits(n: int) -> np.ndarray:
    """n float32 bit patterns spread over all of them: every binade, subnormals, NaNs, negatives."""
    bits = np.linspace(0, 2**32 - 1, n, dtype=np.uint64).astype(np.uint32)
    specials = np.array(
        [
            0x0,
            0x80000000,
            0x1,
            0x7FFFFF,
            0x800000,
            0x7F7FFFFF,
            0x7F800000,
            0xFF800000,
            0x7FC00000,
            0x3F800000,
            0x40000000,
        ],
        dtype=np.uint32,
    )
    return np.concatenate([bits, specials])


def _reference(x: np.ndarray, inverse: bool) -> np.ndarray:
    """The correctly rounded float32 result, through float64 (sqrt in float64 then rounded to
    float32 is correctly rounded; 1/sqrt too, but for ties within 2^-53, which the 1-ulp bound
    covers)."""
    with np.errstate(invalid="ignore", divide="ignore"):  # signalling NaNs, x <= 0
        x64 = x.astype(np.float64)
        r = 1.0 / np.sqrt(x64) if inverse else np.sqrt(x64)
    return r.astype(np.float32)


# The sweeps below include signalling-NaN bit patterns on purpose; under the CPU interpreter NumPy
# flags any arithmetic on them (the kernel's answer, NaN, is checked all the same).
SIGNALLING_NAN_INPUTS = pytest.mark.filterwarnings(
    "ignore:invalid value encountered:RuntimeWarning"
)


@SIGNALLING_NAN_INPUTS
@pytest.mark.parametrize("op, inverse", [(sqrt, False), (rsqrt, True)], ids=["sqrt", "rsqrt"])
def test_within_one_ulp_over_a_sweep_of_every_binade(op, inverse):
    x = _sweep_bits(size(100_003, 30_000_001)).view(np.float32)
    got = op(torch.from_numpy(x).to(DEVICE)).cpu().numpy()
    ulps = ulp_distance_f32(got, _reference(x, inverse))
    worst = np.argsort(ulps)[-5:]
    assert ulps.max() <= 1, f"worst inputs {x[worst]} -> {got[worst]}, {ulps[worst]} ulp"
    assert np.array_equal(np.signbit(got[got == 0]), np.signbit(_reference(x, inverse)[got == 0]))


@pytest.mark.gpu
@pytest.mark.parametrize("op, inverse", [(sqrt, False), (rsqrt, True)], ids=["sqrt", "rsqrt"])
def test_within_one_ulp_on_all_2_pow_32_inputs(op, inverse):
    worst, wrong = 0, 0
    chunk = 1 << 28
    for start in range(0, 1 << 32, chunk):
        bits = torch.arange(start, start + chunk, device="cuda", dtype=torch.int64)
        x = bits.to(torch.int32).view(torch.float32)  # wraps into the int32 pattern of every float
        ref = (1 / torch.sqrt(x.double()) if inverse else torch.sqrt(x.double())).float()
        got = op(x)
        both_nan = got.isnan() & ref.isnan()
        ordinal = lambda t: torch.where(
            t.view(torch.int32) < 0,  # noqa: E731
            -(t.view(torch.int32).long() & 0x7FFFFFFF),
            t.view(torch.int32).long(),
        )
        d = torch.where(both_nan, 0, (ordinal(got) - ordinal(ref)).abs())
        d = torch.where(got.isnan() ^ ref.isnan(), 1 << 40, d)
        worst = max(worst, int(d.max()))
        wrong += int((d > 0).sum())
    assert worst <= 1
    print(f"{op.__name__}: {wrong} of 2^32 inputs not correctly rounded, all within 1 ulp")


@SIGNALLING_NAN_INPUTS
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "op, ref", [(sqrt, torch.sqrt), (rsqrt, torch.rsqrt)], ids=["sqrt", "rsqrt"]
)
def test_half_types_all_65536_inputs_within_one_ulp(dtype, op, ref):
    x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype).to(DEVICE)
    got = op(x)
    want = ref(x.double()).to(dtype)  # float64 then one rounding to the half type
    assert got.dtype == dtype
    ordinal = lambda t: torch.where(
        t.view(torch.int16) < 0,  # noqa: E731
        -(t.view(torch.int16).int() & 0x7FFF),
        t.view(torch.int16).int(),
    )
    finite = ~(got.isnan() | want.isnan())
    assert torch.equal(got.isnan(), want.isnan())
    assert int((ordinal(got[finite]) - ordinal(want[finite])).abs().max()) <= 1


def test_special_values_match_torch():
    x = torch.tensor(
        [0.0, -0.0, math.inf, -math.inf, math.nan, -1.0, -1e-45, -math.inf], device=DEVICE
    )
    for op, ref in [(sqrt, torch.sqrt), (rsqrt, torch.rsqrt)]:
        got, want = op(x), ref(x)
        assert torch.equal(got.isnan(), want.isnan())
        ok = ~want.isnan()
        assert torch.equal(got[ok], want[ok]) and torch.equal(got[ok].signbit(), want[ok].signbit())


@pytest.mark.parametrize("n", [1, 127, 4097, 10_001])
@pytest.mark.parametrize("block", [128, 1024, 4096])
def test_every_element_written_for_sizes_that_do_not_divide_the_block(n, block):
    x = torch.rand(n, device=DEVICE) * 100
    out = poison_(torch.empty_like(x))
    torch.ops.kernelnotes.sqrt_out(x, out, block)  # the operator takes the tile size
    assert not out.isnan().any()
    assert (
        ulp_distance_f32(out.cpu().numpy(), _reference(x.cpu().numpy(), inverse=False)).max() <= 1
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("op", [sqrt, rsqrt], ids=["sqrt", "rsqrt"])
def test_out_is_fully_written_with_the_no_out_result(op, dtype):
    n = size(1000, 100_003)  # not a multiple of BLOCK: the last program is masked
    assert n % BLOCK
    x = (torch.rand(n, device=DEVICE) * 100).to(dtype)
    out = poison_(torch.empty_like(x))
    assert op(x, out=out) is out
    assert not out.isnan().any()
    assert torch.equal(out, op(x))


def test_any_shape_and_empty():
    x = torch.rand(3, 5, 7, device=DEVICE)
    assert sqrt(x).shape == (3, 5, 7)
    got = rsqrt(x).cpu().numpy()
    assert ulp_distance_f32(got, _reference(x.cpu().numpy(), inverse=True)).max() <= 1
    empty = torch.empty(0, 4, device=DEVICE)
    assert sqrt(empty).shape == (0, 4)


def test_the_kernel_runs_where_the_suite_says():
    x = torch.ones(8, device=DEVICE)
    assert sqrt(x).device.type == ("cuda" if ON_GPU else "cpu")


def test_signatures_mirror_torch():
    # torch.sqrt(input, *, out=None): the same names, the same kinds, annotated
    for fn in (sqrt, rsqrt):
        params = inspect.signature(fn).parameters
        assert list(params) == ["input", "out"]
        assert params["input"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        assert params["out"].kind is inspect.Parameter.KEYWORD_ONLY
        assert params["out"].default is None
        hints = typing.get_type_hints(fn)
        assert hints["input"] is torch.Tensor and hints["return"] is torch.Tensor
        assert {"Args:", "Returns:", "Raises:"} <= set(fn.__doc__.split())
    x = torch.tensor([4.0, 9.0], device=DEVICE)
    assert torch.equal(sqrt(input=x), torch.tensor([2.0, 3.0], device=DEVICE))


# ---------------------------------------------------------------- custom operators

OPS = {"sqrt": (sqrt, torch.sqrt), "rsqrt": (rsqrt, torch.rsqrt)}


def _positive(*shape: int, dtype: torch.dtype = torch.float32, lo: float = -3.0, hi: float = 3.0,
              device: str = DEVICE, seed: int = 0) -> torch.Tensor:
    """10^u with u uniform in [lo, hi]: positive values over six decades."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo
    return (10.0**u).to(dtype).to(device)


@pytest.mark.parametrize("name", ["sqrt", "rsqrt"])
def test_opcheck(name):
    op = getattr(torch.ops.kernelnotes, name).default
    op_out = getattr(torch.ops.kernelnotes, f"{name}_out").default
    x = _positive(3, 5)
    torch.library.opcheck(op, (x,))
    torch.library.opcheck(op, (x.clone().requires_grad_(),))  # the autograd registration
    torch.library.opcheck(op, (x.to(torch.bfloat16), 128))
    torch.library.opcheck(op_out, (x, torch.empty_like(x)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["sqrt", "rsqrt"])
def test_the_direct_launch_gives_the_operators_result(name, dtype):
    # plain tensors without autograd skip the dispatcher (less host time); traced or
    # differentiated calls go through the operator: both run the same launcher
    ours = OPS[name][0]
    x = _x(4, 6, dtype=dtype)
    same = {"rtol": 0, "atol": 0, "equal_nan": True}
    torch.testing.assert_close(ours(x), getattr(torch.ops.kernelnotes, name)(x), **same)
    out, out_op = torch.empty_like(x), torch.empty_like(x)
    ours(x, out=out)
    getattr(torch.ops.kernelnotes, f"{name}_out")(x, out_op)
    torch.testing.assert_close(out, out_op, **same)


def test_traced_calls_record_the_operator():
    from torch.fx.experimental.proxy_tensor import make_fx

    graph = make_fx(lambda t: rsqrt(sqrt(t)))(_positive(5)).code
    assert "torch.ops.kernelnotes.sqrt.default" in graph
    assert "torch.ops.kernelnotes.rsqrt.default" in graph


def test_ops_run_under_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    with FakeTensorMode():
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            x = torch.empty(3, 4, dtype=dtype, device=DEVICE)
            for op in (sqrt, rsqrt):
                y = op(x)
                assert isinstance(y, FakeTensor)
                assert (y.shape, y.dtype, y.device) == (x.shape, dtype, x.device)
        out = torch.empty(4, 3, device=DEVICE)
        assert rsqrt(torch.empty(4, 3, device=DEVICE), out=out) is out
        assert sqrt(torch.empty(4, 3, dtype=torch.int64, device=DEVICE)).dtype == torch.float32
        with pytest.raises(TypeError, match="input"):
            sqrt(torch.empty(3, dtype=torch.float64, device=DEVICE))


def _compiled_matches_eager(backend: str | None) -> None:
    def f(x):  # loss y1 - y2: both terms of the gradient are positive, nothing cancels
        return sqrt(x) * 2.0, rsqrt(x + 1.0)

    def f_out(x, out):
        sqrt(x, out=out)
        return out * 2.0

    kw = {"fullgraph": True} | ({"backend": backend} if backend else {})
    x = _positive(size(37, 1 << 20))
    xg = x.clone().requires_grad_()
    got = torch.compile(f, **kw)(xg)
    (got[0].sum() - got[1].sum()).backward()
    want_x = x.clone().requires_grad_()
    want = f(want_x)
    (want[0].sum() - want[1].sum()).backward()
    out_got, out_want = torch.empty_like(x), torch.empty_like(x)
    got_out = torch.compile(f_out, **kw)(x, out_got)
    # aot_eager runs the traced graph with eager kernels: equal; inductor generates its own
    # kernels for the torch ops around ours and for the backward formulas (its division and
    # pow may round differently): within a few fp32 roundings
    tol = {"rtol": 0, "atol": 0} if backend == "aot_eager" else {"rtol": 1e-6, "atol": 0}
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(xg.grad, want_x.grad, **tol)
    torch.testing.assert_close(got_out, f_out(x, out_want), **tol)
    torch.testing.assert_close(out_got, out_want, **tol)


def test_torch_compile_fullgraph_aot_eager_gives_eager_results():
    torch._dynamo.reset()
    _compiled_matches_eager("aot_eager")


@pytest.mark.gpu
def test_torch_compile_fullgraph_inductor_gives_eager_results():
    torch._dynamo.reset()
    _compiled_matches_eager(None)


def test_requires_grad_is_kept_not_detached():
    x = _positive(5).requires_grad_()
    for op in (sqrt, rsqrt):
        y = op(x)
        assert y.requires_grad and y.grad_fn is not None
        (g,) = torch.autograd.grad(y.sum(), x)
        assert torch.isfinite(g).all() and (g != 0).all()
    with torch.no_grad():
        assert not sqrt(x).requires_grad


# Relative tolerance of the gradient against float64 autograd, per dtype. The forward result y is
# within one ulp (relative 2^-23 in fp32, 2^-10 fp16, 2^-7 bf16); rsqrt's -grad * y^3 / 2 triples
# that and adds about three roundings of half an ulp each: 4.5 ulp at worst (sqrt's grad / (2 y):
# 1.5 ulp). So 4.5 * 2^-23 = 5.4e-7 < 1e-6 for fp32, 4.4e-3 < 5e-3 for fp16, 3.5e-2 < 4e-2 for bf16.
GRAD_RTOL = {torch.float32: 1e-6, torch.float16: 5e-3, torch.bfloat16: 4e-2}


def _assert_grad_close(name: str, x: torch.Tensor, g: torch.Tensor) -> None:
    ours, theirs = OPS[name]
    xg = x.clone().requires_grad_()
    (got,) = torch.autograd.grad(ours(xg), xg, g)
    x64 = x.double().requires_grad_()
    (want,) = torch.autograd.grad(theirs(x64), x64, g.double())
    err = ((got.double() - want).abs() / want.abs()).max().item()
    assert got.dtype == x.dtype and err <= GRAD_RTOL[x.dtype], (name, x.dtype, err)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["sqrt", "rsqrt"])
def test_gradient_matches_float64_autograd(name, dtype):
    # x in [1e-3, 1e3], fp16 [1e-3, 1e2]: the gradients stay normal numbers (rsqrt's reach 2.4e4;
    # at x = 1e3 they fall to 7.9e-6, below fp16's smallest normal 6.1e-5, where a subnormal's
    # relative spacing, not the formula, would set the error)
    x = _positive(size(301, 1 << 24), dtype=dtype, hi=2.0 if dtype == torch.float16 else 3.0)
    g = (torch.rand(x.shape, generator=torch.Generator().manual_seed(1)) + 0.5).to(dtype)
    _assert_grad_close(name, x, g.to(DEVICE))


@pytest.mark.parametrize("name", ["sqrt", "rsqrt"])
def test_gradient_at_special_values_is_torchs(name):
    # +-0, inf, negatives, NaN: the same formulas on the same outputs give the same inf/NaN/0
    ours, theirs = OPS[name]
    x = torch.tensor([0.0, -0.0, math.inf, -1.0, math.nan, 4.0], device=DEVICE)
    got_x, want_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    (got,) = torch.autograd.grad(ours(got_x).sum(), got_x)
    (want,) = torch.autograd.grad(theirs(want_x).sum(), want_x)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[~want.isnan()], want[~want.isnan()])


@pytest.mark.parametrize("op", [sqrt, rsqrt], ids=["sqrt", "rsqrt"])
def test_gradcheck_through_the_fp32_kernel(op):
    # gradcheck wants float64; the kernel is fp32, so the check runs op(x.float()).double().
    # eps = 1e-3 on x in [1, 2]: the central difference's truncation error is ~1e-7, the fp32
    # rounding of x + eps and of the result adds ~2^-24 / 1e-3 = 6e-5: hence atol 2e-4.
    x = torch.linspace(1.0, 2.0, 7, dtype=torch.float64, device=DEVICE, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: op(t.float()).double(), (x,), eps=1e-3,
                                    atol=2e-4, rtol=1e-3)


@pytest.mark.parametrize("name", ["sqrt", "rsqrt"])
def test_second_derivative_matches_float64_autograd(name):
    # the backward is made of torch ops on the saved output, so it is differentiable again
    ours, theirs = OPS[name]
    x = _positive(size(41, 1 << 20), lo=-1.0, hi=1.0)
    xg, x64 = x.clone().requires_grad_(), x.double().requires_grad_()
    (d1,) = torch.autograd.grad(ours(xg).sum(), xg, create_graph=True)
    (d2,) = torch.autograd.grad(d1.sum(), xg)
    (w1,) = torch.autograd.grad(theirs(x64).sum(), x64, create_graph=True)
    (w2,) = torch.autograd.grad(w1.sum(), x64)
    # y within 1 ulp; y^3 (y^5 for rsqrt's second derivative) and a few roundings: < 1e-5
    assert ((d2.double() - w2).abs() / w2.abs()).max() < 1e-5


@pytest.mark.parametrize("name", ["sqrt", "rsqrt"])
def test_out_with_autograd_is_refused_as_torch_refuses_it(name):
    ours, theirs = OPS[name]
    x = _positive(4).requires_grad_()
    with pytest.raises(RuntimeError, match=r"out=\.\.\. arguments don't support automatic"):
        theirs(x, out=torch.empty(4, device=DEVICE))
    with pytest.raises(RuntimeError, match=r"out=\.\.\. arguments don't support automatic"):
        ours(x, out=torch.empty(4, device=DEVICE))
    with torch.no_grad():  # without grad mode, out= is fine
        out = torch.empty(4, device=DEVICE)
        assert ours(x, out=out) is out


def test_the_operators_refuse_bad_arguments_clearly():
    x = torch.ones(4, device=DEVICE)
    with pytest.raises(ValueError, match="block must be a power of two >= 128, got 100"):
        torch.ops.kernelnotes.sqrt(x, 100)
    with pytest.raises(TypeError, match=r"x must have dtype in .*got float64"):
        torch.ops.kernelnotes.rsqrt(x.double())
    with pytest.raises(TypeError, match=r"x must have dtype in .*got int32"):
        torch.ops.kernelnotes.sqrt_out(x.int(), torch.empty(4, device=DEVICE))


def test_out_partially_overlapping_the_input_gets_the_right_values():
    # out = buf[1:], input = buf[:-1]: each lane would read what another has written; the
    # launcher computes into a fresh tensor first
    buf = _positive(9)
    want = torch.sqrt(buf[:-1])
    got = sqrt(buf[:-1], out=buf[1:])
    assert ulp_distance_f32(got.cpu().numpy(), want.cpu().numpy()).max() <= 1


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sqrt", "rsqrt"])
def test_gradient_at_full_size_over_forty_decades_on_gpu(name):
    # 2^26 fp32 values in [1e-20, 1e20]: every gradient is a normal fp32 number
    x = _positive(1 << 26, lo=-20.0, hi=20.0)
    g = torch.rand(x.shape, device=DEVICE) + 0.5
    _assert_grad_close(name, x, g)


# ---------------------------------------------------------------- bad input, tabled

OTHER_DEVICE = "cpu" if ON_GPU else "meta"  # a device the kernel does not run on


def _ordinal(t: torch.Tensor) -> torch.Tensor:
    """Float bits as integers ordered like the floats (-0 and +0 both 0): a difference is in
    ulps."""
    ints = {2: torch.int16, 4: torch.int32}[t.element_size()]
    i = t.contiguous().view(ints).long()
    sign_mask = (1 << (8 * t.element_size() - 1)) - 1
    return torch.where(i < 0, -(i & sign_mask), i)


def _assert_as_torch(got: torch.Tensor, want: torch.Tensor) -> None:
    """Same shape, dtype, device, requires_grad and NaNs as torch's result, each other value
    within one ulp of it (both are within half and one ulp of the exact result), zeros signed
    alike."""
    assert (got.shape, got.dtype, got.device) == (want.shape, want.dtype, want.device)
    assert got.requires_grad == want.requires_grad
    got, want = got.detach().cpu(), want.detach().cpu()
    assert torch.equal(got.isnan(), want.isnan())
    ok = ~want.isnan()
    if got.dtype.is_floating_point and got.dtype != torch.float64:
        ulps = (_ordinal(got[ok]) - _ordinal(want[ok])).abs()
        assert ulps.numel() == 0 or int(ulps.max()) <= 1
    else:
        # float64 out: torch may round once from float64, we from float32: 1.5 fp32 ulp
        assert torch.allclose(got[ok], want[ok], rtol=2**-22, atol=0)
    zeros = want[ok] == 0
    assert torch.equal(got[ok][zeros].signbit(), want[ok][zeros].signbit())


VALUES = [4.0, 2.0, 0.0, -0.0, 1e-45, -1.0, math.inf, -math.inf, math.nan, 3e38, 0.25, 7.0]


def _x(*shape: int, dtype: torch.dtype = torch.float32, device: str = DEVICE) -> torch.Tensor:
    """Deterministic values with every special case, cycled to fill ``shape``."""
    n = math.prod(shape)
    v = torch.tensor((VALUES * (n // len(VALUES) + 1))[:n], dtype=torch.float32)
    return v.reshape(shape).to(dtype).to(device)


TORCH = "as torch"  # the row is handled as torch handles it: same result, or same exception type
# (kind, call(op) -> result, expected): each call builds fresh tensors, so that torch's run and
# ours do not share an out= tensor
BAD_INPUTS = [
    ("not a tensor (list)", lambda op: op([1.0, 2.0]), (TypeError, "input")),
    ("not a tensor (float)", lambda op: op(2.0), (TypeError, "input")),
    ("float64", lambda op: op(_x(6, dtype=torch.float64)), (TypeError, "input")),
    ("complex64", lambda op: op(_x(6).to(torch.complex64)), (TypeError, "input")),
    ("int32 (promoted)",
     lambda op: op(torch.arange(-3, 9, dtype=torch.int32, device=DEVICE)), TORCH),
    ("bool (promoted)", lambda op: op(torch.tensor([True, False], device=DEVICE)), TORCH),
    ("rank 0", lambda op: op(torch.tensor(2.0, device=DEVICE)), TORCH),
    ("rank 5", lambda op: op(_x(2, 1, 3, 1, 2)), TORCH),
    ("empty", lambda op: op(_x(0, 3)), TORCH),
    ("non-contiguous", lambda op: op(_x(4, 6).t()), TORCH),
    ("NaN, inf, -0, negatives, subnormals", lambda op: op(_x(len(VALUES))), TORCH),
    ("half types' specials", lambda op: op(_x(12, dtype=torch.bfloat16)), TORCH),
    ("wrong device", lambda op: op(_x(6, device=OTHER_DEVICE)), (ValueError, "input")),
    ("requires_grad", lambda op: op(_x(6).abs().requires_grad_()), TORCH),
    ("out: not a tensor", lambda op: op(_x(6), out=[0.0] * 6), (TypeError, "out")),
    ("out: positional", lambda op: op(_x(6), _x(6)), TORCH),
    ("out: mismatched shape", lambda op: op(_x(6), out=_x(5)), (ValueError, "out")),
    ("out: empty (resized)", lambda op: op(_x(2, 3), out=_x(0)), TORCH),
    ("out: mixed dtype (float16)", lambda op: op(_x(6), out=_x(6, dtype=torch.float16)), TORCH),
    ("out: mixed dtype (float64)", lambda op: op(_x(6), out=_x(6, dtype=torch.float64)), TORCH),
    ("out: int32", lambda op: op(_x(6), out=torch.empty(6, dtype=torch.int32, device=DEVICE)),
     (TypeError, "out")),
    ("out: wrong device", lambda op: op(_x(6), out=_x(6, device=OTHER_DEVICE)),
     (ValueError, "out")),
    ("out: non-contiguous", lambda op: op(_x(3, 4), out=_x(4, 3).t()), TORCH),
    ("out: is the input", lambda op: (lambda x: op(x, out=x))(_x(3, 4)), TORCH),
    ("out: input requires grad",
     lambda op: op(_x(6).abs().requires_grad_(), out=_x(6)), TORCH),
]


@SIGNALLING_NAN_INPUTS
@pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")
@pytest.mark.parametrize("name", ["sqrt", "rsqrt"])
@pytest.mark.parametrize("kind, call, expected", BAD_INPUTS, ids=[r[0] for r in BAD_INPUTS])
def test_bad_input_table(name, kind, call, expected):
    ours, theirs = {"sqrt": (sqrt, torch.sqrt), "rsqrt": (rsqrt, torch.rsqrt)}[name]
    if expected != TORCH:
        err, argname = expected
        with pytest.raises(err, match=rf"\b{argname}\b"):
            call(ours)
        return
    try:
        want = call(theirs)
    except Exception as e:  # torch refuses it: so must we, with the same exception type
        with pytest.raises(type(e)):
            call(ours)
        return
    _assert_as_torch(call(ours), want)
