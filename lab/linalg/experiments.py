"""The numerical experiments of the LU/QR and regression posts (float64, NumPy only).

Each returns arrays that the posts plot and check: loss of orthogonality of Gram-Schmidt and
Householder against the condition number, and digits lost by the normal equations against QR.
"""

from __future__ import annotations

import numpy as np

from kernelnotes.linalg.reference import cgs, form_q, householder_qr, lstsq_normal, lstsq_qr, mgs

U64 = 2.0**-53  # float64 unit roundoff


# --8<-- [start:with_cond]
def matrix_with_cond(m: int, n: int, cond: float, rng: np.random.Generator) -> np.ndarray:
    """A = U diag(s) V^T, random orthonormal U and V, s from 1 down to 1/cond: cond_2(A) = cond."""
    U, _ = np.linalg.qr(rng.standard_normal((m, n)))
    V, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return (U * np.geomspace(1.0, 1.0 / cond, n)) @ V.T
# --8<-- [end:with_cond]


# --8<-- [start:orthogonality]
def orthogonality_loss(conds, m: int = 60, n: int = 12, seed: int = 0) -> dict[str, np.ndarray]:
    """||Q^T Q - I||_2 of CGS, MGS and Householder on matrices of the given condition numbers."""
    rng = np.random.default_rng(seed)
    out: dict[str, list[float]] = {"CGS": [], "MGS": [], "Householder": []}
    for cond in conds:
        A = matrix_with_cond(m, n, cond, rng)
        for name, Q in (("CGS", cgs(A)[0]), ("MGS", mgs(A)[0]),
                        ("Householder", form_q(householder_qr(A)[0]))):
            out[name].append(np.linalg.norm(Q.T @ Q - np.eye(n), 2))
    return {k: np.asarray(v) for k, v in out.items()}
# --8<-- [end:orthogonality]


# --8<-- [start:digits_lost]
def digits_lost(conds, m: int = 100, n: int = 10, seed: int = 0) -> dict[str, np.ndarray]:
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
