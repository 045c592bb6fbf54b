"""Least-squares regression, written the way docs/posts/03-linear-regression.md writes it.

A line y = m x + b, a plane, and a linear layer Y = X W^T + 1 b^T are all one problem:
min ||X theta - y||_2 for a design matrix X with a column of ones. NumPy only.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from kernelnotes.linalg.reference import (
    apply_qt,
    back_substitution,
    householder_qr,
    lstsq_normal,
    lstsq_qr,
    matrix_with_cond,
)

U64 = 2.0**-53  # float64 unit roundoff


# --8<-- [start:design]
def design_matrix(x: np.ndarray) -> np.ndarray:
    """X = [x, 1]: one row per data point, the features then a column of ones for the bias."""
    x = np.asarray(x, dtype=np.float64)
    x = x[:, None] if x.ndim == 1 else x  # [n, i]
    return np.column_stack([x, np.ones(len(x))])  # [n, i + 1]


def loss(X: np.ndarray, theta: np.ndarray, y: np.ndarray) -> float:
    """L(theta) = ||X theta - y||_2^2, the sum of squared residuals."""
    r = X @ theta - y  # residuals [n]
    return float(r @ r)


def gradient(X: np.ndarray, theta: np.ndarray, y: np.ndarray) -> np.ndarray:
    """grad L = 2 X^T (X theta - y)."""
    return 2.0 * X.T @ (X @ theta - y)  # [d]
# --8<-- [end:design]


# --8<-- [start:fit]
def fit_normal(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """theta from the normal equations X^T X theta = X^T y."""
    return np.linalg.solve(X.T @ X, X.T @ y)  # [d] (or [d, o] for several outputs)


def fit_qr(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """theta from X = QR: R theta = Q^T y, by back substitution."""
    V, R = householder_qr(X)  # X [n, d], n >= d
    return back_substitution(R, apply_qt(V, y)[: X.shape[1]])  # [d] (or [d, o])


def fit_centered(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """The line through the means: m = sum dx dy / sum dx^2, b = y_bar - m x_bar, dx = x - x_bar."""
    dx, dy = x - x.mean(), y - y.mean()
    m = float(dx @ dy / (dx @ dx))
    return m, float(y.mean() - m * x.mean())
# --8<-- [end:fit]


# --8<-- [start:linear_layer]
def fit_linear_layer(X: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """W [o, i] and b [o] minimizing ||X W^T + 1 b^T - Y||_F: one problem per output."""
    theta = fit_qr(design_matrix(X), Y)  # [i + 1, o]: the rows of W^T, then b^T
    return theta[:-1].T, theta[-1]
# --8<-- [end:linear_layer]


# --8<-- [start:digits_lost]
def digits_lost(conds: Iterable[float], m: int = 100, n: int = 10,
                seed: int = 0) -> dict[str, np.ndarray]:
    """log10(relative error / u) of the least-squares solution, normal equations against QR.

    b = A x_true exactly up to rounding (a zero-residual problem), so QR's error is about u cond
    and the normal equations' about u cond^2, until that reaches 1 (all digits gone).
    """
    rng = np.random.default_rng(seed)
    out: dict[str, list[float]] = {"normal equations": [], "QR": []}
    for cond in conds:
        A = matrix_with_cond(m, n, cond, rng)
        x_true = rng.standard_normal(n)
        b = A @ x_true
        for name, solve in (("normal equations", lstsq_normal), ("QR", lstsq_qr)):
            err = np.linalg.norm(solve(A, b) - x_true) / np.linalg.norm(x_true)
            out[name].append(np.log10(max(err, U64) / U64))
    return {k: np.asarray(v) for k, v in out.items()}
# --8<-- [end:digits_lost]


def line_data(n: int = 30, slope: float = 0.8, intercept: float = 2.0, noise: float = 1.0,
              seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """n noisy points around y = slope x + intercept, x uniform in [0, 10]."""
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(0.0, 10.0, n))
    return x, slope * x + intercept + noise * rng.standard_normal(n)


def plane_data(n: int = 60, w: tuple[float, float] = (1.5, -0.7), b: float = 3.0,
               noise: float = 1.0, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """n noisy points around z = w_1 x_1 + w_2 x_2 + b, (x_1, x_2) uniform in [0, 10]^2."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(0.0, 10.0, (n, 2))
    return X, X @ np.asarray(w) + b + noise * rng.standard_normal(n)
