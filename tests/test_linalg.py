"""LU, QR and least squares: the NumPy references against float64 LAPACK, the Triton kernels
against both.

Error measures are the backward errors the post bounds: ||P A - L U|| / ||A||, ||Q R - A|| / ||A||,
||Q^T Q - I||, each within a small multiple of n u (u = fp32 unit roundoff for the kernels), and
least-squares solutions within the conditioning bound of the float64 solution.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernelnotes._testing import UNIT_ROUNDOFF, rel_err
from kernelnotes.linalg import reference as ref
from tests._machine import DEVICE, ON_GPU, size

U32 = UNIT_ROUNDOFF["float32"]
U64 = UNIT_ROUNDOFF["float64"]
OTHER = "cpu" if ON_GPU else "meta"  # a device the kernels cannot use: "on another device"


def _kernel():
    from kernelnotes.linalg import kernel

    return kernel


def _config():
    """A fixed launch configuration: autotuning under the interpreter would only cost time."""
    import triton

    return None if ON_GPU else triton.Config({}, num_warps=1)


def _with_cond(rng, m: int, n: int, cond: float) -> np.ndarray:
    """A random m x n matrix with singular values spread geometrically from 1 down to 1/cond."""
    U, _ = np.linalg.qr(rng.standard_normal((m, n)))
    V, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return (U * np.geomspace(1.0, 1.0 / cond, n)) @ V.T


def _perm_rows(A: torch.Tensor, piv: torch.Tensor) -> torch.Tensor:
    """P A (float64) from 1-based sequential pivots, by swaps replayed in torch, not by the kernel
    (row_permutation itself is checked against torch.lu_unpack below)."""
    n = A.shape[-1]
    a = A.double().reshape(-1, n, n)
    perm = _kernel().row_permutation(piv.reshape(-1, n))
    return torch.gather(a, 1, perm[..., None].expand(-1, -1, n)).reshape(A.shape)


def _unpack(LU: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = LU.shape[-1]
    L = torch.tril(LU.double(), -1) + torch.eye(n, dtype=torch.float64, device=LU.device)
    return L, torch.triu(LU.double())


# ---------------------------------------------------------------------------------------------
# NumPy references (float64)

@pytest.mark.parametrize("n", [1, 2, 7, 20])
def test_reference_lu(n):
    rng = np.random.default_rng(n)
    A = rng.standard_normal((n, n))
    L, U = ref.lu_nopivot(A)
    assert np.allclose(np.tril(L), L) and np.allclose(np.triu(U), U) and np.all(np.diag(L) == 1)
    assert rel_err(L @ U, A) < 100 * n * U64 * np.linalg.cond(A)  # no pivoting: no better bound
    LU, piv = ref.lu_factor(A)
    P = ref.permutation(piv)
    Lp, Up = np.tril(LU, -1) + np.eye(n), np.triu(LU)
    assert rel_err(Lp @ Up, A[P]) < 10 * n * U64
    assert np.abs(np.tril(LU, -1)).max(initial=0.0) <= 1.0  # partial pivoting: |m_ik| <= 1
    lu_t, piv_t = torch.linalg.lu_factor(torch.from_numpy(A))  # LAPACK dgetrf, independent
    assert np.array_equal(piv + 1, piv_t.numpy())
    assert rel_err(LU, lu_t) < 10 * n * U64 * np.linalg.cond(A)


def test_reference_triangular_and_lu_solve():
    rng = np.random.default_rng(1)
    A = rng.standard_normal((9, 9))
    b = rng.standard_normal((9, 3))
    L = np.tril(A) + 9 * np.eye(9)
    assert rel_err(ref.forward_substitution(L, b, unit=False), np.linalg.solve(L, b)) < 100 * U64
    assert rel_err(ref.back_substitution(L.T, b), np.linalg.solve(L.T, b)) < 100 * U64
    LU, piv = ref.lu_factor(A)
    x = ref.lu_solve(LU, piv, b)
    assert rel_err(x, np.linalg.solve(A, b)) < 100 * 9 * U64 * np.linalg.cond(A)


@pytest.mark.parametrize("shape", [(6, 6), (12, 5), (40, 13)])
def test_reference_qr(shape):
    rng = np.random.default_rng(sum(shape))
    A = rng.standard_normal(shape)
    m, n = shape
    for method in (ref.cgs, ref.mgs):
        Q, R = method(A)
        assert rel_err(Q @ R, A) < 10 * n * U64 and np.allclose(np.triu(R), R)
    V, R = ref.householder_qr(A)
    Q = ref.form_q(V)
    assert rel_err(Q @ R, A) < 10 * n * U64
    assert np.linalg.norm(Q.T @ Q - np.eye(n)) < 10 * n * U64
    vtv = np.sum(V * V, axis=0)
    assert np.all((np.abs(vtv - 2.0) < 1e-12) | (vtv == 0.0))  # v^T v = 2, or H = I (v = 0)
    assert rel_err(ref.apply_qt(V, A)[:n], R) < 10 * n * U64  # Q^T A = [R; 0]
    assert np.linalg.norm(ref.apply_qt(V, A)[n:]) < 10 * n * U64 * np.linalg.norm(A)
    Q_full = ref.apply_q(V, np.eye(m))  # H_1 ... H_p I: the full m x m Q
    assert rel_err(Q_full[:, :n], Q) < 10 * m * U64
    assert np.linalg.norm(Q_full.T @ Q_full - np.eye(m)) < 10 * m * U64
    C = rng.standard_normal((m, 2))
    assert rel_err(ref.apply_q(V, C), Q_full @ C) < 10 * m * U64
    assert rel_err(ref.apply_q(V, ref.apply_qt(V, C)), C) < 10 * m * U64  # Q Q^T = I
    R_lapack = np.linalg.qr(A, mode="r")  # same sign convention, R_kk = -sign(a_kk) ||x||
    assert rel_err(R, R_lapack) < 10 * n * U64 * np.linalg.cond(A)
    for nb in (1, 2, 3, n):
        Vb, Rb = ref.blocked_qr(A, nb)
        assert rel_err(Rb, R) < 10 * n * U64 and rel_err(Vb, V) < 10 * n * U64


def test_reference_householder_vector_signs_and_zero():
    for x in ([3.0, 1.0, 2.0], [-3.0, 1.0, 2.0], [0.0, 1.0, -2.0]):
        x = np.array(x)
        v, beta = ref.householder_vector(x)
        Hx = x - v * (v @ x)
        assert abs(beta) == pytest.approx(np.linalg.norm(x)) and np.sign(beta) != np.sign(x[0] or 1)
        assert np.allclose(Hx, beta * np.eye(len(x))[0], atol=1e-14)
    for x in ([-5.0], [0.0, 0.0, 0.0], [2.0, 0.0]):  # nothing to zero: H = I, beta = x_1
        v, beta = ref.householder_vector(np.array(x))
        assert np.all(v == 0) and beta == x[0]


@pytest.mark.parametrize("k", [1, 2, 5])
def test_reference_wy(k):
    rng = np.random.default_rng(k)
    V, _ = ref.householder_qr(rng.standard_normal((8, k)))
    W, Y = ref.wy(V)
    H = np.eye(8)
    for j in range(k):
        H = H @ (np.eye(8) - np.outer(V[:, j], V[:, j]))
    assert np.linalg.norm(np.eye(8) + W @ Y.T - H) < 100 * U64
    if k == 2:  # the post's identity: W_2 = [-v_1, -v_2 + t v_1], t = v_1^T v_2
        t = V[:, 0] @ V[:, 1]
        assert np.allclose(W, np.column_stack([-V[:, 0], -V[:, 1] + t * V[:, 0]]), atol=1e-15)


def test_regression_helpers():
    from kernelnotes.linalg import regression as reg

    x, y = reg.line_data()
    X = reg.design_matrix(x)
    theta = reg.fit_qr(X, y)
    assert rel_err(theta, np.linalg.lstsq(X, y, rcond=None)[0]) < 100 * U64
    assert rel_err(reg.fit_normal(X, y), theta) < 100 * U64 * np.linalg.cond(X) ** 2
    assert rel_err(reg.fit_centered(x, y), theta) < 100 * U64 * np.linalg.cond(X)
    assert np.linalg.norm(reg.gradient(X, theta, y)) < 1e-10 * np.linalg.norm(X.T @ y)
    rng = np.random.default_rng(0)
    Xi = rng.standard_normal((50, 3))
    W0, b0 = rng.standard_normal((2, 3)), rng.standard_normal(2)
    W, b = reg.fit_linear_layer(Xi, Xi @ W0.T + b0)  # exact data: exact recovery
    assert rel_err(W, W0) < 100 * U64 and rel_err(b, b0) < 100 * U64


def test_gram_schmidt_orthogonality_scales_with_condition():
    """||Q^T Q - I||: CGS grows like u cond^2, MGS like u cond, Householder stays at u."""
    rng = np.random.default_rng(7)
    A = _with_cond(rng, 60, 12, 1e6)
    loss = {}
    for name, method in (("cgs", ref.cgs), ("mgs", ref.mgs)):
        Q, _ = method(A)
        loss[name] = np.linalg.norm(Q.T @ Q - np.eye(12), 2)
    loss["hh"] = np.linalg.norm(ref.form_q(ref.householder_qr(A)[0]).T
                                @ ref.form_q(ref.householder_qr(A)[0]) - np.eye(12), 2)
    assert loss["hh"] < 100 * U64
    assert 1e-2 * U64 * 1e6 < loss["mgs"] < 1e2 * U64 * 1e6
    assert loss["cgs"] > 1e-2 * U64 * 1e12 and loss["cgs"] > 1e3 * loss["mgs"]


def test_reference_lstsq_normal_equations_lose_twice_the_digits():
    rng = np.random.default_rng(3)
    cond = 1e6
    A = _with_cond(rng, 50, 8, cond)
    x_true = rng.standard_normal(8)
    b = A @ x_true  # consistent: the QR error is then about u cond, the normal equations' u cond^2
    err_qr = rel_err(ref.lstsq_qr(A, b), x_true)
    err_ne = rel_err(ref.lstsq_normal(A, b), x_true)
    assert err_qr < 100 * U64 * cond
    assert err_ne > 1e3 * err_qr
    assert rel_err(ref.lstsq_qr(A, b), np.linalg.lstsq(A, b, rcond=None)[0]) < 100 * U64 * cond


def test_growth_factor_wilkinson():
    """Partial pivoting on the classic worst case: U_nn = 2^(n-1), exact in fp64, and the solve
    fails."""
    n = 60
    A = ref.wilkinson_growth_matrix(n)
    LU, piv = ref.lu_factor(A)
    assert np.array_equal(piv, np.arange(n))  # no row exchange ever happens
    assert ref.growth_factor(A, LU) == 2.0 ** (n - 1) and np.isfinite(LU).all()
    x_true = np.random.default_rng(0).standard_normal(n)
    b = A @ x_true
    assert rel_err(ref.lu_solve(LU, piv, b), x_true) > 0.1  # digits all gone ...
    assert rel_err(ref.lstsq_qr(A, b), x_true) < 100 * U64 * np.linalg.cond(A)  # ... QR is fine


def test_flop_counts_match_formulas():
    for n in (1, 2, 10, 100):
        assert 6 * ref.lu_flops(n) == 4 * n**3 - 3 * n**2 - n  # 2/3 n^3 - 1/2 n^2 - 1/6 n exactly
    for m, n in ((100, 100), (400, 100), (2000, 100)):
        h = ref.householder_flops(m, n)
        assert abs(h / (2 * m * n**2 - 2 * n**3 / 3) - 1) < 5 / n  # lower-order terms only


# ---------------------------------------------------------------------------------------------
# Triton kernels (fp32): the launchers, with fixed configurations

@pytest.mark.parametrize("n", [1, 5, 16, 17, 32, 33])  # 32: the last row-per-lane size
def test_lu_factor(n):
    K = _kernel()
    batch = size(3, 4096)
    g = torch.Generator().manual_seed(n)
    A = torch.randn(batch, n, n, generator=g).to(DEVICE)
    LU, piv, info = K._launch_lu_factor(A, _config())
    assert torch.isfinite(LU).all() and (piv >= 1).all() and (info == 0).all()
    L, U = _unpack(LU)
    assert rel_err(L @ U, _perm_rows(A, piv)) < 10 * n * U32
    assert L.abs().max() <= 1.0
    lu_t, piv_t, _ = torch.linalg.lu_factor_ex(A.cpu().double())
    assert (piv.cpu() == piv_t).float().mean() > 0.99  # the same pivots but for rare near-ties


@pytest.mark.parametrize("mats,warps", [(2, 1), (4, 1), (4, 2)])
def test_lu_factor_several_matrices_per_program(mats, warps):
    """MATS > 1 gives bitwise the MATS = 1 result, with a batch that does not divide by MATS and
    bad matrices that must not leak into neighbours: in the row-per-lane kernel (n = 5, 16) and
    in the whole-tile kernel ([NP, MATS, NP] tile, n = 40; 4x the warps, for its registers)."""
    import triton

    K = _kernel()
    for n in (5, 16, 40):
        w = 4 * warps if n > K.ROWS_MAX_N else warps
        batch = 2 * mats + 1  # 5 or 9
        g = torch.Generator().manual_seed(10 * n + mats)
        A = torch.randn(batch, n, n, generator=g)
        A[1] = 0.0  # info 1
        A[2, :, 3] = 0.0  # info 4
        A[3, 1, 0] = float("nan")
        A[4, :, 1] = A[4, :, 1].round()  # exact ties in a column
        A = A.to(DEVICE)
        LU, piv, info = K._launch_lu_factor(A, triton.Config({"MATS": mats}, num_warps=w))
        LU1, piv1, info1 = K._launch_lu_factor(A, triton.Config({"MATS": 1}, num_warps=w))
        assert torch.equal(piv, piv1) and torch.equal(info, info1)
        assert torch.equal(LU.isnan(), LU1.isnan())
        assert torch.equal(LU.nan_to_num(), LU1.nan_to_num())
        good = [i for i in range(batch) if i != 3]
        assert torch.isnan(LU[3]).any() and torch.isfinite(LU[good]).all()
        _, piv_t, info_t = torch.linalg.lu_factor_ex(A[good].cpu().double())
        assert torch.equal(info[good].cpu(), info_t) and info_t[1] == 1 and info_t[2] == 4
        assert (piv[good].cpu() == piv_t).float().mean() > 0.99
        L, U = _unpack(LU[good])
        assert rel_err(L @ U, _perm_rows(A[good], piv[good])) < 10 * n * U32


def test_lu_factor_singular_and_edge_values():
    K = _kernel()
    A = torch.randn(4, 4, 4)
    A[0] = 0.0  # first pivot zero
    A[1, :, 2] = 0.0  # a zero column: U_33 = 0 exactly
    A[2] = torch.tensor([[1.0, 2.0, 3.0, 4.0]]).T @ torch.tensor([[1.0, -1.0, 2.0, 0.5]])  # rank 1
    A[3] = torch.eye(4)
    LU, piv, info = K.lu_factor_ex(A.to(DEVICE))
    _, piv_t, info_t = torch.linalg.lu_factor_ex(A.double())
    assert info.cpu().tolist() == info_t.tolist() and info_t[3] == 0 and (info_t[:3] > 0).all()
    assert torch.isfinite(LU).all()  # a zero pivot leaves its column unscaled, no inf/NaN
    L, U = _unpack(LU.cpu())
    assert rel_err(L @ U, _perm_rows(A, piv.cpu())) < 40 * U32
    with pytest.raises(RuntimeError, match=r"U\[0,0\] is zero"):
        K.lu_factor(A.to(DEVICE))  # as torch.linalg.lu_factor: singular input raises
    with pytest.raises(RuntimeError, match="is zero"):
        K.lu_factor_ex(A.to(DEVICE), check_errors=True)


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning",
                            "ignore:invalid value:RuntimeWarning")  # the interpreter's numpy
def test_lu_solve_zero_pivot_gives_inf_or_nan_exactly_there():
    """The documented getrs behaviour: X is non-finite for the batch elements whose U has an
    exactly zero pivot (info > 0), and only for those."""
    K = _kernel()
    n = 6
    A = torch.randn(5, n, n, generator=torch.Generator().manual_seed(6)) + n**0.5 * torch.eye(n)
    A[1] = 0.0
    A[3, :, 2] = 0.0
    # rank 1 with power-of-two row scales: every multiplier and product of the elimination is
    # exact, so the second pivot is exactly 0 in any precision and operation order (with rows
    # scaled 1..6 it is left over from rounding, and LAPACK's info then depends on its BLAS)
    A[4] = 2.0 ** torch.arange(n)[:, None] * torch.tensor([1.0, -1.0, 2.0, 0.5, 3.0, -2.0])
    LU, piv, info = K.lu_factor_ex(A.to(DEVICE))
    _, _, info_t = torch.linalg.lu_factor_ex(A.double())  # LAPACK: which ones are singular
    assert torch.equal(info.cpu(), info_t) and info_t.tolist() == [0, 1, 0, 3, 2]
    B = torch.randn(5, n, 2, device=DEVICE)
    X = K.lu_solve(LU, piv, B)
    assert torch.equal(torch.isfinite(X).flatten(1).all(dim=1), info == 0)


def test_lu_solve_foreign_pivots_give_nan():
    """Step k of lu_factor swaps row k with a row in [k, n): pivots[k] in [k + 1, n], 1-based.
    Any other value (past the tile, inside the padding past n, zero, or before k) gives an all-NaN
    X for that batch element, and leaves the others alone."""
    K = _kernel()
    n = 5
    A = torch.randn(5, n, n, generator=torch.Generator().manual_seed(5)) + n**0.5 * torch.eye(n)
    B = torch.randn(5, n, 2)
    LU, piv = K.lu_factor(A.to(DEVICE))
    bad = piv.clone()
    bad[1, 2] = 99
    bad[2, 0] = n + 2  # 0-based n + 1: a padding row of the tile, outside B
    bad[3, 4] = 0
    bad[4, 3] = 3  # step 3 (0-based) swapping with row 2, already a row of U
    assert ((piv >= torch.arange(1, n + 1, device=DEVICE)) & (piv <= n)).all()  # lu_factor's
    X = K.lu_solve(LU, bad, B.to(DEVICE))
    X_good = K.lu_solve(LU, piv, B.to(DEVICE))
    assert torch.isnan(X[1:]).all() and torch.equal(X[0], X_good[0])
    assert torch.isfinite(X_good).all()


@pytest.mark.parametrize("n,k", [(1, 1), (17, 3)])
def test_lu_solve(n, k):
    K = _kernel()
    batch = size(3, 4096)
    g = torch.Generator().manual_seed(100 + n)
    A = (torch.randn(batch, n, n, generator=g) + n**0.5 * torch.eye(n)).to(DEVICE)
    B = torch.randn(batch, n, k, generator=g).to(DEVICE)
    LU, piv, _ = K._launch_lu_factor(A, _config())
    X = K._launch_lu_solve(LU, piv, B, _config())
    assert torch.isfinite(X).all()
    Ad, Xd, Bd = A.double(), X.double(), B.double()
    backward = ((Ad @ Xd - Bd).flatten(1).norm(dim=1)
                / (Ad.flatten(1).norm(dim=1) * Xd.flatten(1).norm(dim=1)))
    assert backward.max() < 10 * n * U32
    X64 = torch.linalg.solve(Ad.cpu(), Bd.cpu())
    cond = torch.linalg.cond(Ad.cpu()).max().item()
    assert rel_err(X, X64) < 10 * n * U32 * cond


@pytest.mark.parametrize("shape", [(1, 1), (16, 1), (17, 17), (40, 13), (5, 9)])
def test_qr(shape):
    K = _kernel()
    m, n = shape
    p = min(m, n)
    batch = size(3, 2048)
    g = torch.Generator().manual_seed(m * 100 + n)
    A = torch.randn(batch, m, n, generator=g).to(DEVICE)
    Q, R = K._launch_qr(A, True, _config())
    assert torch.isfinite(Q).all() and torch.isfinite(R).all()
    assert torch.equal(R, torch.triu(R))
    Qd, Rd = Q.double(), R.double()
    assert rel_err(Qd @ Rd, A) < 10 * max(p, 2) * U32
    eye = torch.eye(p, dtype=torch.float64, device=DEVICE)
    assert (Qd.mT @ Qd - eye).flatten(1).norm(dim=1).max() < 10 * max(p, 2) * U32
    R64 = torch.linalg.qr(A.cpu().double()).R  # LAPACK's signs, the same as ours
    assert rel_err(R, R64) < 10 * p * U32 * torch.linalg.cond(A.cpu().double()).max().item()
    Q0, R_only = K._launch_qr(A, False, _config())
    assert Q0.numel() == 0 and torch.isfinite(R_only).all()
    assert torch.equal(R_only, torch.triu(R_only))  # every element written, zeros too
    # the same reflections without forming Q; compiled separately, so equal up to rounding
    assert rel_err(R_only, R) < 10 * p * U32


def test_qr_rank_deficient_and_zero():
    K = _kernel()
    A = torch.randn(3, 12, 6)
    A[0] = 0.0
    A[1, :, 4] = A[1, :, 0] - 2 * A[1, :, 1]  # rank 5
    Q, R = K.qr(A.to(DEVICE))
    assert torch.isfinite(Q).all() and torch.isfinite(R).all()
    assert R[0].abs().max() == 0 and torch.equal(Q[0].cpu(), torch.eye(12, 6))  # H = I throughout
    assert rel_err(Q.double() @ R.double(), A) < 60 * U32
    assert R[1, 4, 4].abs() < 60 * U32 * A[1].norm()  # the dependent column leaves ~u ||A|| behind


@pytest.mark.parametrize("cond", [1.0, 1e3])
def test_lstsq(cond):
    K = _kernel()
    m, n, k = 40, 13, 2
    batch = size(3, 4096)
    rng = np.random.default_rng(int(cond))
    A64 = np.stack([_with_cond(rng, m, n, cond) for _ in range(batch)])
    B64 = A64 @ rng.standard_normal((batch, n, k)) + 1e-3 * rng.standard_normal((batch, m, k))
    A = torch.from_numpy(A64).float().to(DEVICE)
    B = torch.from_numpy(B64).float().to(DEVICE)
    X, res, rank = K._launch_lstsq(A, B, m * K.EPS_FP32, _config())
    assert (rank == n).all() and torch.isfinite(X).all()
    # the fp32-rounded problem, solved in float64, is the reference
    Ad, Bd = A.double().cpu(), B.double().cpu()
    X64 = torch.linalg.lstsq(Ad, Bd, driver="gelsd").solution
    assert rel_err(X, X64) < _wedin_bound(Ad, Bd, X64, cond)
    res64 = (Ad @ X64 - Bd).square().sum(dim=-2)  # ||A x - b||^2 per column
    assert rel_err(res, res64) < 100 * m * U32 * cond  # a difference of near-equal squares


def test_lstsq_rank_deficient_reports_rank():
    K = _kernel()
    A = torch.randn(3, 20, 5)
    A[1, :, 3] = 2 * A[1, :, 1]  # exactly dependent (2x is exact in fp32)
    A[2] = 0.0
    B = torch.randn(3, 20, 1)
    X, res, rank, sv = K.lstsq(A.to(DEVICE), B.to(DEVICE))
    assert rank.dtype == torch.int64 and rank.cpu().tolist() == [5, 4, 0]
    assert torch.isfinite(X[0]).all() and torch.isnan(X[1:]).all()  # never silently wrong
    assert torch.isfinite(res[0]).all() and torch.isnan(res[1:]).all() and sv.numel() == 0


def test_lstsq_rcond():
    """rank counts the |R_jj| > rcond max_i |R_ii|: a matrix with cond 1e5 is full rank at the
    default rcond = max(m, n) eps, and loses the R_jj below a larger rcond (R from float64 QR)."""
    K = _kernel()
    m, n = 20, 6
    rng = np.random.default_rng(11)
    A = torch.from_numpy(np.stack([_with_cond(rng, m, n, 1e5) for _ in range(3)])).float()
    B = torch.from_numpy(rng.standard_normal((3, m, 1))).float()
    d = torch.linalg.qr(A.double()).R.diagonal(dim1=-2, dim2=-1).abs()
    ratio = d / d.max(dim=-1, keepdim=True).values  # |R_jj| / max_i |R_ii|
    X, _, rank, _ = K.lstsq(A.to(DEVICE), B.to(DEVICE))
    assert (ratio > m * 2 * U32).all() and (rank == n).all() and torch.isfinite(X).all()
    for rcond in (1e-3, 0.5):
        # fp32 moves |R_jj| / max by about u ||A|| / |R_jj| (relative): keep clear of the edge
        assert ((ratio / rcond - 1).abs() > 1e-2).all()
        expected = n - (ratio <= rcond).sum(dim=-1)
        X, _, rank, _ = K.lstsq(A.to(DEVICE), B.to(DEVICE), rcond=rcond)
        assert torch.equal(rank.cpu(), expected) and (expected < n).all()
        assert torch.isnan(X).all()
    _, _, rank, _ = K.lstsq(A.to(DEVICE), B.to(DEVICE), rcond=0.0)
    assert (rank == n).all()  # only an exactly zero R_jj is too small


def test_lstsq_nan_in_a_is_reported():
    """A NaN in A gives a NaN R_jj from its column j on: rank is at most j and the solution is all
    NaN, also for n = 1 and a NaN below the diagonal, where no later column would carry it. A NaN
    in B alone is no fault of A: full rank, NaN only in that right-hand side."""
    K = _kernel()
    for n, (i, j) in ((5, (7, 3)), (5, (0, 0)), (5, (12, 4)), (1, (9, 0))):
        A = torch.randn(2, 20, n, generator=torch.Generator().manual_seed(n + i))
        A[1, i, j] = float("nan")
        X, _, rank, _ = K.lstsq(A.to(DEVICE), torch.randn(2, 20, 2).to(DEVICE))
        assert rank[0].item() == n and rank[1].item() <= j, (n, i, j)
        assert torch.isfinite(X[0]).all() and torch.isnan(X[1]).all()
    A = torch.randn(20, 5)
    B = torch.randn(20, 2)
    B[3, 1] = float("nan")
    X, _, rank, _ = K.lstsq(A.to(DEVICE), B.to(DEVICE))
    assert rank.item() == 5 and torch.isfinite(X[:, 0]).all() and torch.isnan(X[:, 1]).all()


def test_batch_elements_are_independent_and_batch_shapes():
    K = _kernel()
    A = torch.randn(2, 3, 9, 6)
    A[0, 1] = float("nan")  # one bad matrix must not leak into its neighbours
    Q, R = K.qr(A.to(DEVICE))
    assert Q.shape == (2, 3, 9, 6) and R.shape == (2, 3, 6, 6)
    assert torch.isnan(R[0, 1]).any()
    assert torch.isfinite(R[0, 0]).all() and torch.isfinite(R[1]).all()
    q1, r1 = K.qr(A[1, 2].to(DEVICE))
    assert torch.equal(r1, R[1, 2]) and torch.equal(q1, Q[1, 2])
    LU, piv, info = K.lu_factor_ex(torch.empty(0, 5, 5, device=DEVICE))
    assert LU.shape == (0, 5, 5) and piv.shape == (0, 5) and info.shape == (0,)


# ---------------------------------------------------------------------------------------------
# Drop-in ops: torch.linalg's return types, custom operators, compile, fake tensors, gradients

def test_torch_return_types():
    K = _kernel()
    A = torch.randn(2, 5, 5, device=DEVICE) + 3 * torch.eye(5, device=DEVICE)
    LU, pivots = K.lu_factor(A)  # two values, as torch.linalg.lu_factor
    assert K.lu_factor(A)._fields == ("LU", "pivots")
    assert K.lu_factor_ex(A)._fields == ("LU", "pivots", "info")
    assert pivots.dtype == torch.int32 and K.lu_factor_ex(A).info.dtype == torch.int32
    assert K.qr(A)._fields == ("Q", "R") and K.qr(A, mode="r").Q.numel() == 0
    assert K.qr(A, mode="complete").Q.shape == (2, 5, 5)
    out = K.lstsq(A, A[..., :2])
    assert out._fields == ("solution", "residuals", "rank", "singular_values")
    assert out.residuals.numel() == 0  # m = n: empty, as torch


def _op_args():
    """Tiny inputs for each custom operator (the interpreter is slow), requiring grad."""
    g = torch.Generator().manual_seed(0)
    A = torch.randn(2, 4, 4, generator=g) + 2 * torch.eye(4)
    LU, piv = torch.linalg.lu_factor(A)
    A2, B2 = torch.randn(2, 6, 3, generator=g), torch.randn(2, 6, 2, generator=g)
    d = lambda t: t.to(DEVICE).requires_grad_()  # noqa: E731
    return {
        "lu_factor_ex": (d(A), False),
        "lu_solve": (d(LU), piv.to(DEVICE), d(torch.randn(2, 4, 2, generator=g))),
        "qr": (d(A2), "reduced"),
        "qr_r": (d(A2), "r"),
        "lstsq": (d(A2), d(B2), 1e-5),
    }


@pytest.mark.parametrize("name", ["lu_factor_ex", "lu_solve", "qr", "qr_r", "lstsq"])
def test_opcheck(name):
    op = getattr(torch.ops.kernelnotes, name.removesuffix("_r")).default
    _kernel()  # registers the operators
    torch.library.opcheck(op, _op_args()[name])


def _public_calls(K):
    """One function of each public op, the inputs it takes, and torch.linalg's counterpart."""
    g = torch.Generator().manual_seed(1)
    A = torch.randn(2, 5, 5, generator=g) + 3 * torch.eye(5)
    A2, B2 = torch.randn(2, 7, 3, generator=g), torch.randn(2, 7, 2, generator=g)
    LU, piv = torch.linalg.lu_factor(A)
    B = torch.randn(2, 5, 2, generator=g)
    return {
        "lu_factor": (lambda A: K.lu_factor(A).LU, lambda A: torch.linalg.lu_factor(A).LU, (A,)),
        "lu_factor_ex": (lambda A: K.lu_factor_ex(A).LU,
                         lambda A: torch.linalg.lu_factor_ex(A).LU, (A,)),
        "lu_solve": (lambda LU, B: K.lu_solve(LU, piv.to(LU.device), B),
                     lambda LU, B: torch.linalg.lu_solve(LU, piv.to(LU.device), B), (LU, B)),
        "qr": (lambda A: _stack_qr(K.qr(A)), lambda A: _stack_qr(torch.linalg.qr(A)), (A2,)),
        "qr_r": (lambda A: K.qr(A, mode="r").R, lambda A: torch.linalg.qr(A).R, (A2,)),
        "lstsq": (lambda A, B: K.lstsq(A, B).solution,
                  lambda A, B: torch.linalg.lstsq(A, B).solution, (A2, B2)),
        "lstsq_residuals": (lambda A, B: K.lstsq(A, B).residuals,
                            lambda A, B: torch.linalg.lstsq(A, B, driver="gelsd").residuals,
                            (A2, B2)),
    }


OPS = ["lu_factor", "lu_factor_ex", "lu_solve", "qr", "qr_r", "lstsq", "lstsq_residuals"]


def _stack_qr(qr):
    """Q [..., m, p] over R^T [..., n, p]: both factors in one tensor."""
    return torch.cat([qr.Q, qr.R.mT], dim=-2)


@pytest.mark.parametrize("name", ["lu_factor", "lu_solve", "qr", "lstsq"])
def test_compile_fullgraph_aot_eager(name):
    """torch.compile(fullgraph=True) of a function calling the public op gives eager's result
    (aot_eager: the graph is traced through the fake implementations, the kernel runs as is)."""
    ours, _, args = _public_calls(_kernel())[name]
    args = tuple(a.to(DEVICE) for a in args)
    compiled = torch.compile(ours, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(*args), ours(*args))
    torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.parametrize("name", OPS)
def test_compile_inductor(name):
    ours, _, args = _public_calls(_kernel())[name]
    args = tuple(a.to(DEVICE) for a in args)
    compiled = torch.compile(ours, fullgraph=True)
    assert torch.equal(compiled(*args), ours(*args))
    torch._dynamo.reset()


def test_fake_tensor_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    K = _kernel()
    with FakeTensorMode():
        A = torch.empty(3, 2, 6, 6, device=DEVICE)
        T, B = torch.empty(3, 40, 13, device=DEVICE), torch.empty(3, 40, 2, device=DEVICE)
        LU, pivots, info = K.lu_factor_ex(A)
        assert (LU.shape, pivots.shape, info.shape) == ((3, 2, 6, 6), (3, 2, 6), (3, 2))
        assert pivots.dtype == info.dtype == torch.int32
        assert K.lu_factor(A).pivots.shape == (3, 2, 6)
        assert K.lu_solve(LU, pivots, A[..., :2]).shape == (3, 2, 6, 2)
        Q, R = K.qr(T)
        assert (Q.shape, R.shape, Q.dtype) == ((3, 40, 13), (3, 13, 13), torch.float32)
        assert K.qr(T.mT).R.shape == (3, 13, 40) and K.qr(T, mode="r").Q.shape == (0,)
        X, res, rank, sv = K.lstsq(T, B)
        assert (X.shape, res.shape, rank.shape, sv.shape) == ((3, 13, 2), (3, 2), (3,), (0,))
        assert rank.dtype == torch.int64
        assert K.lstsq(T, B[..., 0]).solution.shape == (3, 13)


# fp32 kernels against float64 torch autograd: the gradients go through triangular solves with
# R or U, so their relative error is about n u cond(A); these inputs have cond(A) < 10, and
# 1e-4 (about 100 n u at n <= 7) leaves room for the sums over the batch.
GRAD_RTOL = 1e-4


@pytest.mark.parametrize("name", OPS)
def test_gradients_against_float64_autograd(name):
    ours, theirs, args = _public_calls(_kernel())[name]
    xs = [a.to(DEVICE).requires_grad_() for a in args]
    x64 = [a.double().requires_grad_() for a in args]
    out = ours(*xs)
    ref = theirs(*x64)
    w = torch.randn(ref.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    got = torch.autograd.grad((out.double().cpu() * w).sum(), xs)
    want = torch.autograd.grad((ref * w).sum(), x64)
    for g, r in zip(got, want, strict=True):
        assert rel_err(g, r) < GRAD_RTOL


@pytest.mark.gpu
@pytest.mark.parametrize("name,shape", [("lu_factor", (4096, 32, 32)), ("lu_solve", (4096, 32, 4)),
                                        ("qr", (4096, 64, 16)), ("lstsq", (4096, 64, 16))])
def test_gradients_full_size_gpu(name, shape):
    K = _kernel()
    batch, m, n = shape
    g = torch.Generator("cuda").manual_seed(3)
    A = torch.randn(batch, m, n if name in ("qr", "lstsq") else m, device="cuda", generator=g)
    if name == "lu_factor":  # diagonally dominant: no near-ties, so fp32 and fp64 pivot alike
        A = A + 4 * m * torch.eye(m, device="cuda")
    elif name == "lu_solve":
        A = A + m**0.5 * torch.eye(m, device="cuda")
    B = torch.randn(batch, m, 4 if name == "lu_solve" else 2, device="cuda", generator=g)
    LU, piv = torch.linalg.lu_factor(A)
    calls = {
        "lu_factor": (lambda A: K.lu_factor(A).LU, lambda A: torch.linalg.lu_factor(A).LU, [A]),
        "lu_solve": (lambda LU, B: K.lu_solve(LU, piv, B),
                     lambda LU, B: torch.linalg.lu_solve(LU, piv, B), [LU, B]),
        "qr": (lambda A: K.qr(A).R, lambda A: torch.linalg.qr(A).R, [A]),
        "lstsq": (lambda A, B: K.lstsq(A, B).solution,
                  lambda A, B: torch.linalg.lstsq(A, B).solution, [A, B]),
    }
    ours, theirs, args = calls[name]
    xs = [a.clone().requires_grad_() for a in args]
    x64 = [a.double().requires_grad_() for a in args]
    out, ref = ours(*xs), theirs(*x64)
    w = torch.randn(ref.shape, dtype=torch.float64, device="cuda", generator=g)
    got = torch.autograd.grad((out.double() * w).sum(), xs)
    want = torch.autograd.grad((ref * w).sum(), x64)
    for gr, r in zip(got, want, strict=True):
        assert rel_err(gr, r) < 1e-3  # n <= 64, cond(A) ~ 10 for these random shapes


# ---------------------------------------------------------------------------------------------
# Bad input: each row is handled as torch handles it, or refused with an error naming the argument

def _raises(exc, match, call):
    def case(K):
        with pytest.raises(exc, match=match):
            call(K)
    return case


def _as_torch(ours, theirs, fields, atol=1e-4):
    """ours(K) equals theirs() (torch.linalg on the same fp32 CPU input): same fields, shapes,
    dtypes, NaN placement per batch element, values within atol."""
    def case(K):
        got, want = ours(K), theirs()
        assert tuple(getattr(got, "_fields", ())) == fields
        for f in fields:
            g, w = getattr(got, f).cpu(), getattr(want, f)
            assert g.shape == w.shape and g.dtype == w.dtype, f
            bad = ~torch.isfinite(w.double())
            assert torch.equal(~torch.isfinite(g.double()), bad), f
            assert torch.allclose(g[~bad].double(), w[~bad].double(), rtol=0, atol=atol), f
    return case


def _nan_as_torch(ours, theirs, fields):
    """A NaN in batch element 1: there ours and torch's results both hold a NaN (where exactly
    depends on the order of operations); element 0 is as torch's."""
    def case(K):
        got, want = ours(K), theirs()
        assert tuple(getattr(got, "_fields", ())) == fields
        for f in fields:
            g, w = getattr(got, f).cpu(), getattr(want, f)
            assert g.shape == w.shape and g.dtype == w.dtype, f
            if g.is_floating_point():
                assert g[1].isnan().any() and w[1].isnan().any(), f
            assert torch.allclose(g[0].double(), w[0].double(), rtol=0, atol=1e-4), f
    return case


def _inputs():
    g = torch.Generator().manual_seed(4)
    A = torch.randn(2, 4, 4, generator=g) + 2 * torch.eye(4)
    T = torch.randn(2, 6, 3, generator=g)
    B = torch.randn(2, 4, 2, generator=g)
    C = torch.randn(2, 6, 2, generator=g)
    return A, T, B, C


A_, T_, B_, C_ = _inputs()
LU_, PIV_ = torch.linalg.lu_factor(A_)
D = DEVICE
NAN_A = A_.clone()
NAN_A[1, 2, 1] = float("nan")
NAN_T = T_.clone()
NAN_T[1, 0, 0] = float("nan")
NAN_B = B_.clone()
NAN_B[0, 1, 1] = float("nan")
NAN_C = C_.clone()
NAN_C[0, 1, 1] = float("nan")
SING = A_.clone()
SING[1, :, 2] = 0.0
LUF, LUFX = ("LU", "pivots"), ("LU", "pivots", "info")
LS = ("solution", "residuals")


def _lu_ex(K, A, **kw):
    return K.lu_factor_ex(A.to(D), **kw)


def _ls(out):  # torch's gels result with our lstsq's compared fields
    return type("R", (), {"solution": out.solution, "residuals": out.residuals})


def _ls_ours(K, *a, **kw):
    out = K.lstsq(*(t.to(D) for t in a), **kw)
    return type("R", (), {"_fields": LS, "solution": out.solution, "residuals": out.residuals})


def _nan_column(K):
    """A NaN in B[0, 1, 1]: torch's gels (MKL) stops with an internal assert there; ours gives NaN
    in that right-hand side only (solution and residual), and torch's values everywhere else."""
    got = K.lstsq(T_.to(D), NAN_C.to(D))
    want = torch.linalg.lstsq(T_, C_, driver="gels")
    for f in LS:
        g, w = getattr(got, f).cpu(), getattr(want, f)
        nan = torch.zeros_like(g, dtype=torch.bool)
        nan[0, ..., 1] = True
        assert torch.equal(g.isnan(), nan), f
        assert torch.allclose(g[~nan], w[~nan], rtol=0, atol=1e-4), f


BAD_INPUTS = [
    # lu_factor
    ("lu_factor", "wrong dtype (float64)", _raises(TypeError, "A", lambda K: K.lu_factor(
        A_.double().to(D)))),
    ("lu_factor", "wrong dtype (int64)", _raises(TypeError, "A", lambda K: K.lu_factor(
        A_.long().to(D)))),
    ("lu_factor", "not a tensor", _raises(TypeError, "A", lambda K: K.lu_factor(A_.numpy()))),
    ("lu_factor", "wrong rank (1-D)", _raises(ValueError, "A", lambda K: K.lu_factor(
        A_[0, 0].to(D)))),
    ("lu_factor", "not square", _raises(ValueError, "A", lambda K: K.lu_factor(T_.to(D)))),
    ("lu_factor", "n > 64", _raises(ValueError, "A", lambda K: K.lu_factor(
        torch.randn(65, 65, device=D)))),
    ("lu_factor", "empty matrix (0 x 0)", _raises(ValueError, "A", lambda K: K.lu_factor(
        torch.empty(2, 0, 0, device=D)))),
    ("lu_factor", "empty batch", _as_torch(lambda K: K.lu_factor(A_[:0].to(D)),
                                           lambda: torch.linalg.lu_factor(A_[:0]), LUF)),
    ("lu_factor", "non-contiguous", _as_torch(lambda K: K.lu_factor(A_.mT.to(D)),
                                              lambda: torch.linalg.lu_factor(A_.mT), LUF)),
    ("lu_factor", "wrong device", _raises(ValueError, "A", lambda K: K.lu_factor(
        A_.to(OTHER)))),
    ("lu_factor", "singular", _raises(RuntimeError, "is zero", lambda K: K.lu_factor(
        SING.to(D)))),
    ("lu_factor", "non-bool pivot", _raises(TypeError, "pivot", lambda K: K.lu_factor(
        A_.to(D), pivot="yes"))),
    ("lu_factor", "pivot=False", _raises(ValueError, "pivot", lambda K: K.lu_factor(
        A_.to(D), pivot=False))),
    # lu_factor_ex
    ("lu_factor_ex", "wrong dtype (float16)", _raises(TypeError, "A", lambda K: _lu_ex(
        K, A_.half()))),
    ("lu_factor_ex", "wrong rank (1-D)", _raises(ValueError, "A", lambda K: _lu_ex(K, A_[0, 0]))),
    ("lu_factor_ex", "not square", _raises(ValueError, "A", lambda K: _lu_ex(K, T_))),
    ("lu_factor_ex", "empty batch", _as_torch(lambda K: _lu_ex(K, A_[:0]),
                                              lambda: torch.linalg.lu_factor_ex(A_[:0]), LUFX)),
    ("lu_factor_ex", "non-contiguous", _as_torch(lambda K: _lu_ex(K, A_.mT),
                                                 lambda: torch.linalg.lu_factor_ex(A_.mT), LUFX)),
    ("lu_factor_ex", "NaN in A", _nan_as_torch(lambda K: _lu_ex(K, NAN_A),
                                               lambda: torch.linalg.lu_factor_ex(NAN_A), LUFX)),
    ("lu_factor_ex", "singular: info", _as_torch(lambda K: _lu_ex(K, SING),
                                                 lambda: torch.linalg.lu_factor_ex(SING), LUFX)),
    ("lu_factor_ex", "wrong device", _raises(ValueError, "A", lambda K: K.lu_factor_ex(
        A_.to(OTHER)))),
    ("lu_factor_ex", "non-bool check_errors", _raises(TypeError, "check_errors", lambda K: _lu_ex(
        K, A_, check_errors="no"))),
    ("lu_factor_ex", "non-bool pivot", _raises(TypeError, "pivot", lambda K: _lu_ex(
        K, A_, pivot=1))),
    # lu_solve
    ("lu_solve", "wrong dtype B (float64)", _raises(TypeError, "B", lambda K: K.lu_solve(
        LU_.to(D), PIV_.to(D), B_.double().to(D)))),
    ("lu_solve", "wrong dtype pivots (int64)", _raises(TypeError, "pivots", lambda K: K.lu_solve(
        LU_.to(D), PIV_.long().to(D), B_.to(D)))),
    ("lu_solve", "wrong rank B (1-D)", _raises(ValueError, "B", lambda K: K.lu_solve(
        LU_.to(D), PIV_.to(D), B_[0, :, 0].to(D)))),
    ("lu_solve", "mismatched n", _raises(ValueError, "B", lambda K: K.lu_solve(
        LU_.to(D), PIV_.to(D), C_.to(D)))),
    ("lu_solve", "mismatched pivots", _raises(ValueError, "pivots", lambda K: K.lu_solve(
        LU_.to(D), PIV_[:, :3].to(D), B_.to(D)))),
    ("lu_solve", "broadcast batch", _as_torch(
        lambda K: type("X", (), {"_fields": ("X",), "X": K.lu_solve(
            LU_[:1].to(D), PIV_[:1].to(D), B_.to(D))}),
        lambda: type("X", (), {"X": torch.linalg.lu_solve(LU_[:1], PIV_[:1], B_)}), ("X",))),
    ("lu_solve", "non-contiguous B", _as_torch(
        lambda K: type("X", (), {"_fields": ("X",), "X": K.lu_solve(
            LU_.to(D), PIV_.to(D), B_.mT.contiguous().mT.to(D)[..., :1])}),
        lambda: type("X", (), {"X": torch.linalg.lu_solve(LU_, PIV_, B_[..., :1])}), ("X",))),
    ("lu_solve", "NaN in B", _as_torch(
        lambda K: type("X", (), {"_fields": ("X",), "X": K.lu_solve(
            LU_.to(D), PIV_.to(D), NAN_B.to(D))}),
        lambda: type("X", (), {"X": torch.linalg.lu_solve(LU_, PIV_, NAN_B)}), ("X",))),
    ("lu_solve", "wrong device", _raises(ValueError, "B", lambda K: K.lu_solve(
        LU_.to(D), PIV_.to(D), B_.to(OTHER)))),
    ("lu_solve", "left=False", _raises(ValueError, "left", lambda K: K.lu_solve(
        LU_.to(D), PIV_.to(D), B_.to(D), left=False))),
    ("lu_solve", "adjoint=True", _raises(ValueError, "adjoint", lambda K: K.lu_solve(
        LU_.to(D), PIV_.to(D), B_.to(D), adjoint=True))),
    ("lu_solve", "non-bool left", _raises(TypeError, "left", lambda K: K.lu_solve(
        LU_.to(D), PIV_.to(D), B_.to(D), left="x"))),
    # qr
    ("qr", "wrong dtype (float64)", _raises(TypeError, "A", lambda K: K.qr(T_.double().to(D)))),
    ("qr", "wrong rank (1-D)", _raises(ValueError, "A", lambda K: K.qr(T_[0, 0].to(D)))),
    ("qr", "m > 256", _raises(ValueError, "A", lambda K: K.qr(torch.randn(257, 3, device=D)))),
    ("qr", "empty matrix (0 rows)", _raises(ValueError, "A", lambda K: K.qr(
        torch.empty(2, 0, 3, device=D)))),
    ("qr", "empty batch", _as_torch(lambda K: K.qr(T_[:0].to(D)),
                                    lambda: torch.linalg.qr(T_[:0]), ("Q", "R"))),
    ("qr", "non-contiguous (wide)", _as_torch(lambda K: K.qr(T_.mT.to(D)),
                                              lambda: torch.linalg.qr(T_.mT), ("Q", "R"))),
    ("qr", "NaN in A", _nan_as_torch(lambda K: K.qr(NAN_T.to(D)),
                                     lambda: torch.linalg.qr(NAN_T), ("Q", "R"))),
    ("qr", "wrong device", _raises(ValueError, "A", lambda K: K.qr(T_.to(OTHER)))),
    ("qr", "invalid mode", _raises(ValueError, "mode", lambda K: K.qr(T_.to(D), mode="full"))),
    ("qr", "non-str mode", _raises(TypeError, "mode", lambda K: K.qr(T_.to(D), mode=1))),
    ("qr", "mode='complete', tall A", _raises(ValueError, "mode", lambda K: K.qr(
        T_.to(D), mode="complete"))),
    ("qr", "mode='complete', wide A", _as_torch(lambda K: K.qr(T_.mT.to(D), mode="complete"),
                                                lambda: torch.linalg.qr(T_.mT, mode="complete"),
                                                ("Q", "R"))),
    ("qr", "mode='r'", _as_torch(lambda K: K.qr(T_.to(D), mode="r"),
                                 lambda: torch.linalg.qr(T_, mode="r"), ("Q", "R"))),
    # lstsq
    ("lstsq", "wrong dtype (float64)", _raises(TypeError, "A", lambda K: K.lstsq(
        T_.double().to(D), C_.double().to(D)))),
    ("lstsq", "mixed dtypes", _raises(TypeError, "B", lambda K: K.lstsq(
        T_.to(D), C_.double().to(D)))),
    ("lstsq", "wrong rank (1-D A)", _raises(ValueError, "A", lambda K: K.lstsq(
        T_[0, 0].to(D), C_[0, 0].to(D)))),
    ("lstsq", "mismatched rows", _raises(ValueError, "B", lambda K: K.lstsq(
        T_.to(D), B_.to(D)))),
    ("lstsq", "wide A", _raises(ValueError, "A", lambda K: K.lstsq(
        T_.mT.to(D), torch.randn(2, 3, 1, device=D)))),
    ("lstsq", "empty batch", _as_torch(lambda K: _ls_ours(K, T_[:0], C_[:0]),
                                       lambda: _ls(torch.linalg.lstsq(T_[:0], C_[:0],
                                                                      driver="gels")), LS)),
    ("lstsq", "non-contiguous", _as_torch(lambda K: _ls_ours(K, T_.mT.contiguous().mT, C_),
                                          lambda: _ls(torch.linalg.lstsq(T_, C_, driver="gels")),
                                          LS)),
    ("lstsq", "B a vector", _as_torch(lambda K: _ls_ours(K, T_, C_[..., 0]),
                                      lambda: _ls(torch.linalg.lstsq(T_, C_[..., 0],
                                                                     driver="gels")), LS)),
    ("lstsq", "broadcast batch", _as_torch(lambda K: _ls_ours(K, T_[:1], C_),
                                           lambda: _ls(torch.linalg.lstsq(T_[:1], C_,
                                                                          driver="gels")), LS)),
    ("lstsq", "NaN in B", _nan_column),
    ("lstsq", "wrong device", _raises(ValueError, "B", lambda K: K.lstsq(
        T_.to(D), C_.to(OTHER)))),
    ("lstsq", "non-finite rcond", _raises(ValueError, "rcond", lambda K: K.lstsq(
        T_.to(D), C_.to(D), rcond=float("nan")))),
    ("lstsq", "negative rcond", _raises(ValueError, "rcond", lambda K: K.lstsq(
        T_.to(D), C_.to(D), rcond=-1.0))),
    ("lstsq", "non-number rcond", _raises(TypeError, "rcond", lambda K: K.lstsq(
        T_.to(D), C_.to(D), rcond="1e-3"))),
    ("lstsq", "invalid driver", _raises(ValueError, "driver", lambda K: K.lstsq(
        T_.to(D), C_.to(D), driver="gelsd"))),
]


@pytest.mark.parametrize("fn,kind,case", BAD_INPUTS, ids=[f"{f}: {k}" for f, k, _ in BAD_INPUTS])
def test_bad_input(fn, kind, case):
    case(_kernel())


def test_bad_input_table_covers_every_public_function():
    import kernelnotes.linalg as linalg

    kinds = {}
    for fn, kind, _ in BAD_INPUTS:
        kinds.setdefault(fn, set()).add(kind)
    ops = {n for n in linalg.__all__ if n[0].islower()}
    assert ops == set(kinds) and all(len(k) >= 8 for k in kinds.values())


@pytest.mark.gpu
def test_refuses_cpu_tensors_on_gpu():
    K = _kernel()
    with pytest.raises(ValueError, match="compiled Triton kernels need a CUDA tensor"):
        K.lu_factor(torch.randn(2, 4, 4))


@pytest.mark.gpu
@pytest.mark.parametrize("op,shape", [("lu", (4096, 64, 64)), ("lu", (16384, 32, 32)),
                                      ("lu", (65536, 16, 16)), ("qr", (256, 256, 64)),
                                      ("qr", (65536, 16, 16)), ("lstsq", (65536, 64, 16))])
def test_full_size_autotuned(op, shape):
    """The issue's sizes through the public ops (autotuned launches)."""
    K = _kernel()
    batch, m, n = shape
    g = torch.Generator("cuda").manual_seed(m + n)
    A = torch.randn(batch, m, n, device="cuda", generator=g)
    if op == "lu":
        LU, piv, info = K.lu_factor_ex(A)
        L, U = _unpack(LU)
        assert rel_err(L @ U, _perm_rows(A, piv)) < 10 * n * U32 and (info == 0).all()
    elif op == "qr":
        Q, R = K.qr(A)
        assert rel_err(Q.double() @ R.double(), A) < 10 * n * U32
        eye = torch.eye(n, dtype=torch.float64, device="cuda")
        assert (Q.double().mT @ Q.double() - eye).flatten(1).norm(dim=1).max() < 10 * n * U32
    else:
        B = torch.randn(batch, m, 1, device="cuda")
        X, _, rank, _ = K.lstsq(A, B)
        Ad, Bd = A.double(), B.double()
        X64 = torch.linalg.lstsq(Ad, Bd).solution
        cond = torch.linalg.cond(Ad).max().item()
        assert (rank == n).all() and rel_err(X, X64) < _wedin_bound(Ad, Bd, X64, cond)


def _wedin_bound(A, B, X, cond: float) -> float:
    """10 n u (cond + cond^2 ||r|| / (||A|| ||x||)): the forward error a backward-stable
    least-squares solver may make (Wedin 1973; Higham, Accuracy and Stability, Thm. 20.1), worst
    batch element."""
    r = (A @ X - B).flatten(1).norm(dim=1)
    ratio = (r / (A.flatten(1).norm(dim=1) * X.flatten(1).norm(dim=1))).max().item()
    return 10 * A.shape[-1] * U32 * (cond + cond**2 * ratio)


def test_row_permutation_matches_torch_lu_unpack():
    A = torch.randn(7, 9, 9, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    LU, piv = torch.linalg.lu_factor(A)
    P, _, _ = torch.lu_unpack(LU, piv)  # A = P L U, so P^T A = L U
    perm = _kernel().row_permutation(piv)
    assert torch.equal(torch.gather(A, 1, perm[..., None].expand(-1, -1, 9)), P.mT @ A)
    with pytest.raises(TypeError, match="pivots must have dtype in"):
        _kernel().row_permutation(piv.float())
