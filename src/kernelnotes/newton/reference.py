"""Newton's method, Halley's method and bisection, written the way the post writes them.

Every solver returns the whole iterate history (``x_0, x_1, ...``), so the post can
print tables, measure convergence orders and plot errors from the same code that finds
the root.
NumPy only: this module imports without torch.
"""

from __future__ import annotations

# --8<-- [start:header]
from collections.abc import Callable

import numpy as np

Fn = Callable[[float], float]
# --8<-- [end:header]


# --8<-- [start:errors]
class RootFindingError(ArithmeticError):
    """A solver could not go on; ``history`` holds the iterates computed so far."""

    def __init__(self, message: str, history: list[float]):
        super().__init__(message)
        self.history = np.asarray(history, dtype=np.float64)


class ZeroDerivativeError(RootFindingError):
    """The tangent is horizontal (or, for Halley's method, nearly so): the update would
    divide by zero, or stall at a point that is not a root."""


class NonFiniteError(RootFindingError):
    """An iterate or a function value is inf or NaN: the iteration has blown up."""


class NoConvergenceError(RootFindingError):
    """``max_iter`` steps were taken without meeting the tolerance."""


# --8<-- [end:errors]


# --8<-- [start:iterate]
def _check_budget(tol: float, max_iter: int) -> None:
    if not (tol > 0 and max_iter >= 1):
        raise ValueError(
            f"need tol > 0 and max_iter >= 1, got tol={tol}, max_iter={max_iter}"
        )


def _finite(value: float, what: str, history: list[float]) -> float:
    if not np.all(np.isfinite(value)):  # np.all: newton_system passes vectors too
        steps = len(history) - 1
        raise NonFiniteError(f"{what} is {value} after {steps} steps", history)
    return value


def iterate(
    step: Callable[[float, list[float]], float],
    x0: float,
    tol: float,
    max_iter: int,
    name: str,
) -> np.ndarray:
    """Run ``x_{n+1} = step(x_n)`` until ``|x_{n+1} - x_n| <= tol max(1, |x_{n+1}|)``.
    """
    _check_budget(tol, max_iter)
    history = [_finite(float(x0), "x0", [float(x0)])]
    for _ in range(max_iter):
        x_next = _finite(step(history[-1], history), "the next iterate", history)
        history.append(x_next)
        if abs(x_next - history[-2]) <= tol * max(1.0, abs(x_next)):
            return np.asarray(history)
    raise NoConvergenceError(
        f"{name} did not converge in {max_iter} steps (tol={tol})", history
    )


# --8<-- [end:iterate]


# --8<-- [start:newton]
def newton(
    f: Fn, df: Fn, x0: float, tol: float = 1e-15, max_iter: int = 50
) -> np.ndarray:
    """Iterates of Newton's method x_{n+1} = x_n - f(x_n) / f'(x_n), to a tiny step."""

    def step(x: float, history: list[float]) -> float:
        fx, dfx = f(x), df(x)
        if dfx == 0:
            raise ZeroDerivativeError(
                f"f'(x) = 0 at x = {x}: the tangent never crosses the axis", history
            )
        return x - fx / dfx  # the root of the tangent L(x) = f(x_n) + f'(x_n)(x - x_n)

    return iterate(step, x0, tol, max_iter, "Newton's method")


# --8<-- [end:newton]


# --8<-- [start:halley]
def halley(
    f: Fn, df: Fn, d2f: Fn, x0: float, tol: float = 1e-15, max_iter: int = 50
) -> np.ndarray:
    """Iterates of Halley's method x_{n+1} = x_n - 2 f f' / (2 f'^2 - f f'')."""

    def step(x: float, history: list[float]) -> float:
        fx, dfx, d2fx = f(x), df(x), d2f(x)
        denom = 2 * dfx**2 - fx * d2fx
        if denom == 0:
            raise ZeroDerivativeError(f"2 f'^2 - f f'' = 0 at x = {x}", history)
        dx = 2 * fx * dfx / denom
        x_next = x - dx
        # dx is Newton's step f/f' times 1 / (1 - f f'' / (2 f'^2)): the two agree near
        # a root, but where f' -> 0 and f does not, dx -> 0 too. So a tiny step counts
        # as convergence only if Newton's step is at most twice as long (a residual
        # test: |f| <= 2 |f' dx|)
        tiny = abs(x_next - x) <= tol * max(1.0, abs(x_next))
        if tiny and abs(fx) > 2 * abs(dfx * dx):
            raise ZeroDerivativeError(
                f"Halley's step is tiny at x = {x} only because f'(x) = {dfx} is: "
                f"f(x) = {fx}, not a root",
                history,
            )
        return x_next

    return iterate(step, x0, tol, max_iter, "Halley's method")


# --8<-- [end:halley]


# --8<-- [start:bisection]
def bisection(
    f: Fn, a: float, b: float, tol: float = 1e-15, max_iter: int = 200
) -> np.ndarray:
    """Midpoints of bisection on [a, b], where f(a) and f(b) differ in sign: one bit a
    step."""
    fa, fb = f(a), f(b)
    if not (np.isfinite(fa) and np.isfinite(fb)):
        raise NonFiniteError(f"f(a) = {fa}, f(b) = {fb} must be finite", [])
    if np.sign(fa) == np.sign(fb) and fa != 0:
        raise ValueError(f"no sign change on [{a}, {b}]: f(a) = {fa}, f(b) = {fb}")
    history: list[float] = []
    for _ in range(max_iter):
        m = (
            a + (b - a) / 2
        )  # midpoint, written so that it stays inside [a, b] in floating point
        history.append(m)
        fm = f(m)
        if fm == 0 or (b - a) / 2 <= tol * max(1.0, abs(m)):
            return np.asarray(history)
        if np.sign(fm) == np.sign(fa):
            a, fa = m, fm  # the root is in [m, b]
        else:
            b = m  # the root is in [a, m]
    raise NoConvergenceError(
        f"bisection did not converge in {max_iter} steps (tol={tol})", history
    )


# --8<-- [end:bisection]


# --8<-- [start:order]
def convergence_order(errors: np.ndarray) -> np.ndarray:
    """Empirical order q_n = log(e_{n+1} / e_n) / log(e_n / e_{n-1}) of successive
    errors."""
    e = np.asarray(errors, dtype=np.float64)
    if e.ndim != 1 or len(e) < 3 or not np.all(e > 0):
        raise ValueError(f"errors must be >= 3 positive numbers, got {e!r}")
    return np.log(e[2:] / e[1:-1]) / np.log(e[1:-1] / e[:-2])


# --8<-- [end:order]


# --8<-- [start:newton_system]
def newton_system(
    F: Callable[[np.ndarray], np.ndarray],
    J: Callable[[np.ndarray], np.ndarray],
    x0: np.ndarray,
    tol: float = 1e-15,
    max_iter: int = 50,
) -> np.ndarray:
    """Multivariate Newton: solve J(x_n) dx = -F(x_n), x_{n+1} = x_n + dx.

    Returns the iterates, shape [steps+1, d]. Stops and fails as ``newton`` does, with
    the iterates so far attached."""
    _check_budget(tol, max_iter)
    x0 = np.asarray(x0, dtype=np.float64)
    if x0.ndim != 1:
        raise ValueError(f"x0 must be a 1-D vector, got shape {x0.shape}")
    history = [_finite(x0, "x0", [x0])]
    for _ in range(max_iter):
        x = history[-1]
        Jx, Fx = np.asarray(J(x)), np.asarray(F(x))
        if Jx.shape != (len(x), len(x)) or Fx.shape != x.shape:
            raise ValueError(f"J(x) must be {(len(x),) * 2} and F(x) {x.shape}, "
                             f"got {Jx.shape}, {Fx.shape}")
        # checked before the solve: an inf in J(x) can give a finite (zero) step
        _finite(Fx, "F(x)", history)
        _finite(Jx, "J(x)", history)
        try:
            dx = np.linalg.solve(Jx, -Fx)  # a linear solve replaces dividing by f'(x)
        except np.linalg.LinAlgError:  # the analogue of f'(x) = 0
            raise ZeroDerivativeError(
                f"J(x) is singular at x = {x.tolist()}: "
                "J dx = -F(x) has no unique solution",
                history,
            ) from None
        history.append(_finite(x + dx, "the next iterate", history))
        if np.linalg.norm(dx) <= tol * max(1.0, np.linalg.norm(history[-1])):
            return np.stack(history)
    raise NoConvergenceError(
        f"Newton's method did not converge in {max_iter} steps (tol={tol})", history
    )


# --8<-- [end:newton_system]


# --8<-- [start:sqrt_by_newton]
MAGIC = 0x5F3759DF  # i -> MAGIC - (i >> 1) halves and negates the exponent: ~1/sqrt(x)


def rsqrt_estimate(x: np.ndarray, steps: int) -> np.ndarray:
    """The kernel's 1/sqrt(x) for normal x > 0: bit-trick y_0, then Newton steps (in
    float64, so what shows is the method's error, not float32 rounding)."""
    i = np.asarray(x, dtype=np.float32).view(np.int32)
    y = (MAGIC - (i >> 1)).astype(np.int32).view(np.float32).astype(np.float64)  # y_0
    x = np.asarray(x, dtype=np.float64)
    for _ in range(steps):
        y = y * (1.5 - 0.5 * x * y * y)  # Newton on g(y) = 1/y^2 - x
    return y


def sqrt_by_newton(x: np.ndarray, steps: int = 2) -> np.ndarray:
    """sqrt(x) = x * (1/sqrt(x)), finished by one Newton step on s^2 - x:
    s += (y/2)(x - s^2)."""
    x = np.asarray(x, dtype=np.float64)
    y = rsqrt_estimate(x, steps)
    s = x * y
    return s + 0.5 * y * (x - s * s)


# --8<-- [end:sqrt_by_newton]
