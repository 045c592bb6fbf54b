"""LU and QR decompositions, triangular solves and least squares, written the way the post writes
them.

Symbols follow docs/posts/02-lu-qr.md: A = LU (or PA = LU), A = QR, reflectors H = I - v v^T with
v^T v = 2, and the compact WY form H_1 ... H_k = I + W Y^T. NumPy only: imports without torch.
Loops are kept where the post has loops; clarity costs speed here, the Triton kernels are the fast
path.
"""

from __future__ import annotations

import numpy as np


# --8<-- [start:lu_nopivot]
def lu_nopivot(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A = L U by Gaussian elimination without row exchanges; L unit lower, U upper triangular."""
    U = np.array(A, dtype=np.float64)  # [n, n], overwritten by U
    n = U.shape[0]
    L = np.eye(n)  # [n, n]
    for k in range(n - 1):
        for i in range(k + 1, n):
            m = U[i, k] / U[k, k]  # multiplier m_ik; divides by zero if the pivot is 0
            L[i, k] = m  # the multiplier is stored where it made a zero
            U[i, k + 1:] -= m * U[k, k + 1:]  # row_i <- row_i - m_ik row_k ...
            U[i, k] = 0.0  # ... which zeroes U_ik by construction
    return L, U
# --8<-- [end:lu_nopivot]


# --8<-- [start:lu_factor]
def lu_factor(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """P A = L U with partial pivoting, packed like LAPACK getrf.

    Returns LU (U on and above the diagonal, the multipliers of L below it) and piv, where step k
    swapped rows k and piv[k] (0-based). A zero pivot leaves its column unscaled (as getrf does).
    """
    LU = np.array(A, dtype=np.float64)  # [n, n]
    n = LU.shape[0]
    piv = np.zeros(n, dtype=np.int64)  # [n]
    for k in range(n):
        p = k + int(np.argmax(np.abs(LU[k:, k])))  # the largest |entry| on or below the diagonal
        piv[k] = p
        LU[[k, p]] = LU[[p, k]]  # swap rows k and p (the multipliers already stored move too)
        if LU[k, k] != 0:
            LU[k + 1:, k] /= LU[k, k]  # multipliers, |m_ik| <= 1
        LU[k + 1:, k + 1:] -= np.outer(LU[k + 1:, k], LU[k, k + 1:])  # rank-1 update of the rest
    return LU, piv


def permutation(piv: np.ndarray) -> np.ndarray:
    """The row order perm with (P A)[i] = A[perm[i]], from the sequence of swaps piv."""
    perm = np.arange(len(piv))
    for k, p in enumerate(piv):
        perm[[k, p]] = perm[[p, k]]
    return perm
# --8<-- [end:lu_factor]


# --8<-- [start:growth]
def wilkinson_growth_matrix(n: int) -> np.ndarray:
    """1 on the diagonal and in the last column, -1 below it: growth 2^(n-1) despite pivoting."""
    A = np.eye(n) - np.tril(np.ones((n, n)), -1)  # [n, n]
    A[:, -1] = 1.0
    return A


def growth_factor(A: np.ndarray, U: np.ndarray) -> float:
    """rho = max |u_ij| / max |a_ij|: how much elimination inflated the entries."""
    return float(np.abs(np.triu(U)).max() / np.abs(A).max())
# --8<-- [end:growth]


# --8<-- [start:with_cond]
def matrix_with_cond(m: int, n: int, cond: float, rng: np.random.Generator) -> np.ndarray:
    """A = U diag(s) V^T, random orthonormal U and V, s from 1 down to 1/cond: cond_2(A) = cond."""
    U, _ = np.linalg.qr(rng.standard_normal((m, n)))
    V, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return (U * np.geomspace(1.0, 1.0 / cond, n)) @ V.T
# --8<-- [end:with_cond]


# --8<-- [start:flops]
def lu_flops(n: int) -> int:
    """Flops of lu_nopivot's loops, counted: one division per multiplier, two per updated entry."""
    return sum((n - k - 1) + 2 * (n - k - 1) ** 2 for k in range(n - 1))


def householder_flops(m: int, n: int) -> int:
    """Flops of householder_qr's loop, counted: about 5h for v, 4hw for v (v^T R), h = m - k."""
    return sum(5 * (m - k) + 4 * (m - k) * (n - k) for k in range(min(m, n)))


def givens_flops(m: int, n: int) -> int:
    """Flops of Givens QR, counted: each of the m - k - 1 zeros in column k rotates two rows
    of width n - k, 4 multiplications and 2 additions per column."""
    return sum((m - k - 1) * 6 * (n - k) for k in range(min(m - 1, n)))
# --8<-- [end:flops]


# --8<-- [start:triangular]
def forward_substitution(L: np.ndarray, b: np.ndarray, unit: bool = True) -> np.ndarray:
    """Solve L y = b, first row first: y_i = (b_i - sum_{j<i} L_ij y_j) / L_ii."""
    y = np.array(b, dtype=np.float64)  # [n] or [n, k]
    for i in range(len(y)):
        y[i] -= L[i, :i] @ y[:i]
        if not unit:
            y[i] /= L[i, i]
    return y


def back_substitution(U: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Solve U x = y, last row first: x_i = (y_i - sum_{j>i} U_ij x_j) / U_ii."""
    x = np.array(y, dtype=np.float64)  # [n] or [n, k]
    for i in reversed(range(len(x))):
        x[i] = (x[i] - U[i, i + 1:] @ x[i + 1:]) / U[i, i]
    return x
# --8<-- [end:triangular]


# --8<-- [start:lu_solve]
def lu_solve(LU: np.ndarray, piv: np.ndarray, b: np.ndarray) -> np.ndarray:
    """x with A x = b from P A = L U: forward L y = P b, then back U x = y."""
    y = forward_substitution(np.tril(LU, -1), np.asarray(b)[permutation(piv)], unit=True)
    return back_substitution(np.triu(LU), y)
# --8<-- [end:lu_solve]


# --8<-- [start:gram_schmidt]
def cgs(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Classical Gram-Schmidt: q_k from a_k minus all its projections R_ik = q_i^T a_k at once."""
    m, n = A.shape
    Q, R = np.zeros((m, n)), np.zeros((n, n))  # [m, n], [n, n]
    for k in range(n):
        R[:k, k] = Q[:, :k].T @ A[:, k]  # every coefficient from the ORIGINAL column a_k
        q = A[:, k] - Q[:, :k] @ R[:k, k]  # q~_k = a_k - sum_i (q_i^T a_k) q_i
        R[k, k] = np.linalg.norm(q)
        Q[:, k] = q / R[k, k]
    return Q, R


def mgs(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Modified Gram-Schmidt: project the running residual v onto q_1, q_2, ... one at a time."""
    m, n = A.shape
    Q, R = np.zeros((m, n)), np.zeros((n, n))  # [m, n], [n, n]
    for k in range(n):
        v = np.array(A[:, k], dtype=np.float64)  # [m]
        for i in range(k):
            R[i, k] = Q[:, i] @ v  # q_i^T v, with v already orthogonal to q_1 .. q_{i-1}
            v -= R[i, k] * Q[:, i]
        R[k, k] = np.linalg.norm(v)
        Q[:, k] = v / R[k, k]
    return Q, R
# --8<-- [end:gram_schmidt]


# --8<-- [start:householder_vector]
def householder_vector(x: np.ndarray) -> tuple[np.ndarray, float]:
    """v with v^T v = 2 and (I - v v^T) x = beta e_1, beta = -sign(x_1) ||x|| (sign(0) = +1).

    When x is already beta e_1 there is nothing to zero: v = 0, H = I, beta = x_1 (as LAPACK).
    """
    if not np.any(x[1:]):
        return np.zeros(len(x)), float(x[0])
    norm_x = np.linalg.norm(x)
    s = 1.0 if x[0] >= 0 else -1.0
    v = np.array(x, dtype=np.float64)  # [len(x)]
    v[0] += s * norm_x  # v = x + sign(x_1) ||x|| e_1: no cancellation in the first entry
    return np.sqrt(2.0) * v / np.linalg.norm(v), -s * norm_x  # now v^T v = 2
# --8<-- [end:householder_vector]


# --8<-- [start:householder_qr]
def householder_qr(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Compact Householder QR: V (column k holds v_k, zero above row k) and R, A = H_1..H_p R."""
    R = np.array(A, dtype=np.float64)  # [m, n], overwritten by R
    m, n = R.shape
    p = min(m, n)
    V = np.zeros((m, p))  # [m, p]
    for k in range(p):
        v, _ = householder_vector(R[k:, k])
        V[k:, k] = v
        R[k:, k:] -= np.outer(v, v @ R[k:, k:])  # H_k R = R - v (v^T R): a rank-1 update
        R[k + 1:, k] = 0.0  # exactly zero below the diagonal (rounding left ~u ||x|| there)
    return V, R[:p]


def apply_qt(V: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Q^T B = H_p ... H_1 B, one reflector at a time (Q is never formed)."""
    C = np.array(B, dtype=np.float64)  # [m] or [m, k]
    for k in range(V.shape[1]):
        v = V[:, k]
        C -= np.multiply.outer(v, v @ C)
    return C


def apply_q(V: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Q B = H_1 ... H_p B: the reflectors in the opposite order (each H_k is its own inverse)."""
    C = np.array(B, dtype=np.float64)  # [m] or [m, k]
    for k in reversed(range(V.shape[1])):
        v = V[:, k]
        C -= np.multiply.outer(v, v @ C)
    return C


def form_q(V: np.ndarray) -> np.ndarray:
    """The thin Q = H_1 ... H_p [I_p; 0], accumulated from the last reflector backwards."""
    m, p = V.shape
    Q = np.eye(m, p)  # [m, p]
    for k in reversed(range(p)):
        v = V[:, k]
        Q -= np.outer(v, v @ Q)
    return Q
# --8<-- [end:householder_qr]


# --8<-- [start:wy]
def wy(V: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """W, Y with I + W Y^T = H_1 ... H_k, by W_j = [W_{j-1}, -v_j - W_{j-1} (Y_{j-1}^T v_j)]."""
    m, k = V.shape
    W, Y = np.zeros((m, 0)), np.zeros((m, 0))  # [m, j]
    for j in range(k):
        v = V[:, j]
        z = -v - W @ (Y.T @ v)  # (I + W Y^T)(I - v v^T) = I + [W, z] [Y, v]^T
        W, Y = np.column_stack([W, z]), np.column_stack([Y, v])
    return W, Y
# --8<-- [end:wy]


# --8<-- [start:blocked_qr]
def blocked_qr(A: np.ndarray, nb: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Householder QR in panels of nb columns; each panel's reflectors update the rest at once.

    The trailing update applies Q_panel^T = (I + W Y^T)^T = I + Y W^T: two matrix products.
    """
    R = np.array(A, dtype=np.float64)  # [m, n]
    m, n = R.shape
    p = min(m, n)
    V = np.zeros((m, p))  # [m, p]
    for j0 in range(0, p, nb):
        j1 = min(j0 + nb, p)
        Vp, Rp = householder_qr(R[j0:, j0:j1])  # unblocked panel: reflectors one at a time
        V[j0:, j0:j1] = Vp
        R[j0:, j0:j1] = 0.0
        R[j0:j0 + Rp.shape[0], j0:j1] = Rp
        W, Y = wy(Vp)  # [m - j0, j1 - j0] each
        C = R[j0:, j1:]  # the trailing matrix, [m - j0, n - j1]
        R[j0:, j1:] = C + Y @ (W.T @ C)  # Q_panel^T C, BLAS-3
    return V, R[:p]
# --8<-- [end:blocked_qr]


# --8<-- [start:lstsq]
def lstsq_normal(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min ||A x - b||_2 by the normal equations A^T A x = A^T b (squares the condition number)."""
    return np.linalg.solve(A.T @ A, A.T @ b)


def lstsq_qr(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min ||A x - b||_2 by Householder QR: R x = (Q^T b)[:n], by back substitution."""
    V, R = householder_qr(A)  # A [m, n], m >= n
    n = A.shape[1]
    return back_substitution(R, apply_qt(V, b)[:n])
# --8<-- [end:lstsq]
