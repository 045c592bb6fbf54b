"""Two float64 studies behind the least-squares claims of the LU/QR and regression posts.

The posts plot digits lost against the condition number for one shape (100 x 10) and a
zero-residual right-hand side (``kernelnotes.linalg.regression.digits_lost``). These studies ask
what the posts only state:

* ``digits_lost_by_shape``: does the shape matter, or only the condition number?
* ``digits_lost_with_residual``: what happens to QR when the fit leaves a large residual?

NumPy only, on the package's public API; ``lab/linalg/test_experiments.py`` asserts the findings.
"""

from __future__ import annotations

import numpy as np

from kernelnotes.linalg.reference import lstsq_normal, lstsq_qr, matrix_with_cond

U64 = 2.0**-53  # float64 unit roundoff
SOLVERS = (("normal equations", lstsq_normal), ("QR", lstsq_qr))


def _digits(x: np.ndarray, x_true: np.ndarray) -> float:
    err = np.linalg.norm(x - x_true) / np.linalg.norm(x_true)
    return float(np.log10(max(err, U64) / U64))


def digits_lost_by_shape(cond: float, shapes, seeds=range(5)) -> dict[str, np.ndarray]:
    """Median digits lost over ``seeds`` for each (m, n) in ``shapes`` at one condition number,
    zero residual: [len(shapes)] per solver."""
    out: dict[str, list[float]] = {name: [] for name, _ in SOLVERS}
    for m, n in shapes:
        lost: dict[str, list[float]] = {name: [] for name, _ in SOLVERS}
        for seed in seeds:
            rng = np.random.default_rng(seed)
            A = matrix_with_cond(m, n, cond, rng)
            x_true = rng.standard_normal(n)
            for name, solve in SOLVERS:
                lost[name].append(_digits(solve(A, A @ x_true), x_true))
        for name in out:
            out[name].append(float(np.median(lost[name])))
    return {k: np.asarray(v) for k, v in out.items()}


def digits_lost_with_residual(conds, residual: float, m: int = 100, n: int = 10,
                              seed: int = 0) -> dict[str, np.ndarray]:
    """Digits lost when b = A x_true + r with r orthogonal to range(A) and ||r|| = residual
    ||A x_true||: x_true is still the exact least-squares solution, but the problem's own
    sensitivity now has a cond^2 ||r|| term (Wedin, 1973) that no algorithm avoids."""
    rng = np.random.default_rng(seed)
    out: dict[str, list[float]] = {name: [] for name, _ in SOLVERS}
    for cond in conds:
        A = matrix_with_cond(m, n, cond, rng)
        x_true = rng.standard_normal(n)
        Ax = A @ x_true
        Q, _ = np.linalg.qr(A, mode="complete")
        r = Q[:, n:] @ rng.standard_normal(m - n)  # orthogonal to every column of A
        b = Ax + residual * np.linalg.norm(Ax) * r / np.linalg.norm(r)
        for name, solve in SOLVERS:
            out[name].append(_digits(solve(A, b), x_true))
    return {k: np.asarray(v) for k, v in out.items()}
