"""Newton's method: the reference solvers' math, and the Triton sqrt/rsqrt against float64."""

from __future__ import annotations

import math

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
    sqrt(x, out=out, block=block)
    assert not out.isnan().any()
    assert (
        ulp_distance_f32(out.cpu().numpy(), _reference(x.cpu().numpy(), inverse=False)).max() <= 1
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("op", [sqrt, rsqrt], ids=["sqrt", "rsqrt"])
def test_out_is_fully_written_with_the_no_out_result(op, dtype):
    block, n = 128, size(1000, 100_003)  # 1000 = 7 * 128 + 104: the last program is masked
    assert n % block
    x = (torch.rand(n, device=DEVICE) * 100).to(dtype)
    out = poison_(torch.empty_like(x))
    assert op(x, out=out, block=block) is out
    assert not out.isnan().any()
    assert torch.equal(out, op(x, block=block))


def test_any_shape_and_empty():
    x = torch.rand(3, 5, 7, device=DEVICE)
    assert sqrt(x).shape == (3, 5, 7)
    got = rsqrt(x).cpu().numpy()
    assert ulp_distance_f32(got, _reference(x.cpu().numpy(), inverse=True)).max() <= 1
    empty = torch.empty(0, 4, device=DEVICE)
    assert sqrt(empty).shape == (0, 4)


@pytest.mark.parametrize(
    "call, err, match",
    [
        (lambda: sqrt([1.0, 2.0]), TypeError, "x must be a torch.Tensor, got list"),
        (
            lambda: sqrt(torch.ones(4, dtype=torch.float64, device=DEVICE)),
            TypeError,
            r"x must have dtype in \(float32, float16, bfloat16\), got float64",
        ),
        (lambda: rsqrt(torch.ones(4, dtype=torch.int32, device=DEVICE)), TypeError, "got int32"),
        (lambda: sqrt(torch.ones(4, 4, device=DEVICE).t()), ValueError, "x must be contiguous"),
        (lambda: sqrt(torch.ones(4, device="meta")), ValueError, "x is on meta"),
        (
            lambda: sqrt(torch.ones(4, device=DEVICE), out=torch.empty(5, device=DEVICE)),
            ValueError,
            r"out has shape \(5,\), x has \(4,\)",
        ),
        (
            lambda: sqrt(
                torch.ones(4, device=DEVICE), out=torch.empty(4, dtype=torch.float16, device=DEVICE)
            ),
            TypeError,
            "out must have dtype in",
        ),
        (
            lambda: sqrt(
                torch.ones(4, device=DEVICE), out=torch.empty(4, device="cpu" if ON_GPU else "meta")
            ),
            ValueError,
            r"out is on (cpu|meta), expected (cuda|cpu)",
        ),
        (
            lambda: rsqrt(torch.ones(4, device=DEVICE), out=torch.empty(4, 2, device=DEVICE)[:, 0]),
            ValueError,
            r"out must be contiguous \(strides \(2,\)",
        ),
        (
            lambda: sqrt(torch.ones(4, device=DEVICE), block=100),
            ValueError,
            "block must be a power of two",
        ),
    ],
    ids=[
        "not-a-tensor",
        "float64",
        "int32",
        "non-contiguous",
        "wrong-device",
        "out-shape",
        "out-dtype",
        "out-device",
        "out-non-contiguous",
        "block",
    ],
)
def test_bad_input_is_refused_clearly(call, err, match):
    with pytest.raises(err, match=match):
        call()


def test_the_kernel_runs_where_the_suite_says():
    x = torch.ones(8, device=DEVICE)
    assert sqrt(x).device.type == ("cuda" if ON_GPU else "cpu")
