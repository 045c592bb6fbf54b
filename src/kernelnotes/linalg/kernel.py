"""Batched LU, QR and least squares for small fp32 matrices in Triton: one program per matrix.

Each program loads its whole matrix into registers as a power-of-two tile (padding masked to zero)
and runs the textbook loop of docs/posts/02-lu-qr.md on it: a column is read out of the tile with
a masked ``tl.sum``, the pivot is a masked ``tl.max``, row swaps are index arithmetic on a vector
of row positions (rows never move in registers), and every elimination or reflection is a rank-1
update of the whole tile. Nothing but the input and the output touches global memory; the
n steps of whole-tile work (reductions across lanes, selects, fmas) are what costs time, and
benchmarks/bench_linalg.py reports how close that comes to the memory roofline. LU at n <= 32
takes another layout (_lu_factor_rows_kernel): one lane per row, the row's columns in registers,
and one warp shared by 32 // NP matrices (MATS), so column k is a register and needs no
reduction. The whole-tile LU kernel also takes MATS > 1 (an [NP, MATS, NP] tile, every reduction
along one matrix's own axes), but only from an explicit config.

Order: the jit helpers and kernels, their launchers, the ``kernelnotes::`` custom operators with
their fake implementations and backward formulas, and the public functions with torch.linalg's
signatures and return types: ``lu_factor``, ``lu_factor_ex``, ``lu_solve``, ``qr`` and ``lstsq``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernelnotes._grid import cdiv, next_power_of_2
from kernelnotes._validate import check_kernel_device, check_real, check_tensor, interpreted

# --8<-- [start:setup]
MAX_N = 64  # columns (and rows of square inputs); the tile is next_pow2(n) wide
MAX_M = 256  # rows of qr / lstsq inputs
MAX_K = 64  # right-hand sides of lu_solve / lstsq
EPS_FP32 = 2.0**-23  # float32's machine epsilon (torch.finfo): lstsq's rcond is max(m, n) eps

# Autotuning chooses how many warps share one matrix's tile (and, for LU, how many matrices a
# program holds); configs that would leave a thread fewer than 4 or more than 32 tile elements
# are pruned before timing (and compiling).
CONFIGS = [triton.Config({}, num_warps=w) for w in (1, 2, 4, 8, 16)]


def _prune(configs, named_args, **kwargs):
    tile = kwargs.get("MP", kwargs.get("NP")) * max(kwargs["NP"], kwargs.get("KP", 1))
    kept = [c for c in configs if 4 <= tile // (32 * c.num_warps) <= 32]
    return kept or configs[:1]


def _autotune(key: list[str]):
    return triton.autotune(CONFIGS, key=key, prune_configs_by={"early_config_prune": _prune})
# --8<-- [end:setup]


# --8<-- [start:lu_kernel]
@triton.jit
def _lu_factor_kernel(
    a_ptr,  # *fp32 [B, n, n] contiguous input
    lu_ptr,  # *fp32 [B, n, n] output: U on and above the diagonal, multipliers of L below
    piv_ptr,  # *int32 [B, n] output: step k swapped rows k and piv[k] - 1 (1-based, as LAPACK)
    info_ptr,  # *int32 [B] output: 0, or i > 0 when U[i-1, i-1] is exactly zero (the first such)
    n,  # matrix order, n <= NP
    B,  # batch size
    NP: tl.constexpr,  # tile size, a power of two
    MATS: tl.constexpr,  # matrices per program, each factored on its own
):
    # The tile is [NP, MATS, NP] (rows, matrix, columns), so that each matrix gets its own lanes
    # in both directions: vectors over rows are [NP, MATS], over columns [MATS, NP].
    mat = tl.program_id(0) * MATS + tl.arange(0, MATS)  # batch index of each matrix   [MATS]
    r = tl.arange(0, NP)[:, None]  # row index      [NP, 1]
    c = tl.arange(0, NP)[None, :]  # column index   [1, NP]
    rows, cols = r[:, :, None], c[None, :, :]
    inside = (mat[None, :, None] < B) & (rows < n) & (cols < n)
    entry = mat.to(tl.int64)[None, :, None] * n * n + rows * n + cols  # [NP, MATS, NP]
    A = tl.load(a_ptr + entry, mask=inside, other=0.0)
    # Rows never move in the tile. loc[i] is where row i is in LAPACK's row-swapped matrix: rows
    # with loc < k are rows of U already, rows with loc >= k are still being eliminated. Padding
    # rows get loc = -1: never a pivot candidate, never updated.
    loc = tl.broadcast_to(tl.where(r < n, r, -1), [NP, MATS])
    piv = tl.zeros([NP, MATS], dtype=tl.int32)  # piv[k]: the position swapped with k at step k
    inv_diag = tl.zeros([MATS, NP], dtype=tl.float32)  # 1 / U_kk (0 for a zero pivot), by column
    info = tl.zeros([MATS], dtype=tl.int32)
    for k in range(n):
        col = tl.sum(tl.where(cols == k, A, 0.0), axis=2)  # column k               [NP, MATS]
        # |a_ik| as int32 bits orders like the float (NaN ranks first as inf, as in idamax);
        # rows of U and padding rows get -1 and never win. Integer reductions are cheaper.
        mag = tl.minimum(tl.abs(col).to(tl.int32, bitcast=True), 0x7F800000)  # NaN -> inf
        mag = tl.where(loc >= k, mag, -1)
        big = tl.max(mag, axis=0)  # |U_kk| (as bits)                                     [MATS]
        # the first largest in LAPACK's row order: row i is the pivot row when loc[i] == j
        j = tl.min(tl.where(mag == big[None, :], loc, NP), axis=0)  # [MATS]
        is_p = loc == j[None, :]  # [NP, MATS]
        pivot = tl.sum(tl.where(is_p, col, 0.0), axis=0)  # U_kk                        [MATS]
        loc = tl.where(is_p, k, tl.where(loc == k, j[None, :], loc))  # swap positions k and j
        u = tl.sum(tl.where(is_p[:, :, None], A, 0.0), axis=0)  # row k of U          [MATS, NP]
        nonzero = pivot != 0.0  # a zero pivot leaves its column unscaled (as getrf)
        inv = tl.where(nonzero, 1.0 / tl.where(nonzero, pivot, 1.0), 0.0)
        info = tl.where((info == 0) & ~nonzero, k + 1, info)
        m = tl.where(loc > k, col * inv[None, :], 0.0)  # multipliers m_ik, |m_ik| <= 1
        A = A - m[:, :, None] * tl.where(c > k, u, 0.0)[None, :, :]  # rank-1 update right of k
        piv = tl.where(r == k, j[None, :], piv)
        inv_diag = tl.where(c == k, inv[:, None], inv_diag)
    # column k was left alone after step k: below the pivot it still holds m_ik U_kk, so one
    # pass makes every multiplier at once (the same product col * inv the update used)
    A = tl.where(loc[:, :, None] > cols, A * inv_diag[None, :, :], A)
    out = entry + (loc[:, :, None] - rows) * n  # row i -> row loc[i]
    tl.store(lu_ptr + out, A, mask=inside)
    live = mat[None, :] < B
    tl.store(piv_ptr + mat.to(tl.int64)[None, :] * n + r, piv + 1, mask=live & (r < n))
    tl.store(info_ptr + mat, info, mask=mat < B)
# --8<-- [end:lu_kernel]


# --8<-- [start:lu_rows_kernel]
@triton.jit
def _row_ptrs(ptr, n, B, mat, row, NP: tl.constexpr, V: tl.constexpr):
    """Pointers and mask, [NP/V, V, MATS, NP], to element (column j, matrix s, lane i) of row
    row[s, i]. The column offset is multiplied by a 1 the compiler cannot see through, so only V
    neighbouring columns look contiguous: Triton then lays each matrix row along its own lane
    (V-wide vector loads) instead of spreading a row across lanes."""
    jb = tl.arange(0, NP // V)[:, None, None, None]
    jv = tl.arange(0, V)[None, :, None, None]
    s4 = mat[None, None, :, None]
    i4 = tl.arange(0, NP)[None, None, None, :]
    one = (B > 0).to(tl.int32)  # == 1 at run time, unknown at compile time
    ptrs = ptr + s4.to(tl.int64) * n * n + row[None, None, :, :] * n + jb * V * one + jv
    return ptrs, (s4 < B) & (i4 < n) & (jb * V + jv < n)


@triton.jit
def _lu_factor_rows_kernel(
    a_ptr, lu_ptr, piv_ptr, info_ptr, n, B,  # as _lu_factor_kernel
    NP: tl.constexpr,  # tile size, a power of two <= 32: one lane per row
    MATS: tl.constexpr,  # matrices per program
):
    # The tile is T[j, s, i] = A_s[i, j]: lane i holds row i of matrix s, its NP columns in
    # registers. With k a compile-time constant (the loop is unrolled), column k is register k
    # of every lane: no reduction at all. The pivot search is a warp reduction, and the pivot
    # row reaches every lane by one shuffle per column (tl.gather along the lanes).
    V: tl.constexpr = 4 if NP >= 4 else NP
    mat = tl.program_id(0) * MATS + tl.arange(0, MATS)  # [MATS]
    i2 = tl.arange(0, NP)[None, :]  # row: the lane            [1, NP]
    j3 = tl.arange(0, NP)[:, None, None]  # column: the register  [NP, 1, 1]
    lanes = tl.broadcast_to(i2, [MATS, NP])
    ptrs, mask = _row_ptrs(a_ptr, n, B, mat, lanes, NP, V)
    T = tl.reshape(tl.load(ptrs, mask=mask, other=0.0), [NP, MATS, NP])
    loc = tl.broadcast_to(tl.where(i2 < n, i2, -1), [MATS, NP])  # as in _lu_factor_kernel
    piv = tl.zeros([MATS, NP], dtype=tl.int32)  # piv[s, k] in lane k
    info = tl.zeros([MATS, NP], dtype=tl.int32)  # the same in every lane of a matrix
    for k in tl.static_range(NP):
        if k < n:
            col = tl.sum(tl.where(j3 == k, T, -0.0), axis=0)  # register k: column k  [MATS, NP]
            mag = tl.minimum(tl.abs(col).to(tl.int32, bitcast=True), 0x7F800000)  # NaN -> inf
            mag = tl.where(loc >= k, mag, -1)
            big = tl.max(mag, axis=1)  # |U_kk| (as bits)                       [MATS]
            # the first largest in LAPACK's row order; the key also names the pivot's lane
            key = tl.min(tl.where(mag == big[:, None], loc * NP + i2, NP * NP), axis=1)
            key = key.to(tl.uint32, bitcast=True)  # >= 0: divisions become shifts
            j = (key // NP).to(tl.int32)  # the pivot row's position in LAPACK's order
            lane = (key % NP).to(tl.int32)  # and the lane that holds it
            is_p = i2 == lane[:, None]
            u = tl.gather(T, tl.broadcast_to(lane[None, :, None], [NP, MATS, NP]), axis=2)
            pivot = tl.sum(tl.where(j3 == k, u, -0.0), axis=0)  # U_kk, in every lane
            loc = tl.where(is_p, k, tl.where(loc == k, j[:, None], loc))  # swap k and j
            nonzero = pivot != 0.0  # a zero pivot leaves its column unscaled (as getrf)
            inv = tl.where(nonzero, 1.0 / tl.where(nonzero, pivot, 1.0), 0.0)
            info = tl.where((info == 0) & ~nonzero, k + 1, info)
            m = tl.where(loc > k, col * inv, 0.0)  # multipliers m_ik          [MATS, NP]
            # right of k the rank-1 update, column k the multipliers, left of k untouched
            T = tl.where(j3 > k, T - m[None, :, :] * u,
                         tl.where((j3 == k) & (loc > k)[None, :, :], m[None, :, :], T))
            piv = tl.where(i2 == k, j[:, None], piv)
    ptrs, mask = _row_ptrs(lu_ptr, n, B, mat, loc, NP, V)  # row i -> row loc[i]
    tl.store(ptrs, tl.reshape(T, [NP // V, V, MATS, NP]), mask=mask)
    live = mat[:, None] < B
    tl.store(piv_ptr + mat.to(tl.int64)[:, None] * n + i2, piv + 1, mask=live & (i2 < n))
    tl.store(info_ptr + mat, tl.max(info, axis=1), mask=mat < B)
# --8<-- [end:lu_rows_kernel]


# --8<-- [start:lu_solve_kernel]
@triton.jit
def _lu_solve_kernel(
    lu_ptr,  # *fp32 [B, n, n] packed factors from lu_factor
    piv_ptr,  # *int32 [B, n] 1-based pivots from lu_factor
    b_ptr,  # *fp32 [B, n, K] right-hand sides
    x_ptr,  # *fp32 [B, n, K] output
    n,
    K,
    NP: tl.constexpr,
    KP: tl.constexpr,  # tile width for the right-hand sides, a power of two
):
    pid = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, NP)
    c = tl.arange(0, NP)
    kc = tl.arange(0, KP)
    rows, cols = r[:, None], c[None, :]
    LU = tl.load(lu_ptr + pid * n * n + rows * n + cols, mask=(rows < n) & (cols < n), other=0.0)
    swaps = tl.load(piv_ptr + pid * n + r, mask=r < n, other=1) - 1  # 0-based  [NP]
    # lu_factor's step k swaps row k with a row in [k, n); a pivot outside that range did not
    # come from lu_factor. It is applied as no swap, so every row read stays inside B, and X is
    # made all NaN: checked here because a check on the host would need a device sync.
    ok = ((swaps >= r) & (swaps < n)) | (r >= n)
    bad = tl.sum(tl.where(ok, 0, 1), axis=0)
    swaps = tl.where(ok, swaps, r)
    perm = r  # (P b)_i = b_perm[i], built from the sequence of swaps
    for k in range(n):
        p = tl.sum(tl.where(r == k, swaps, 0), axis=0)
        perm_k = tl.sum(tl.where(r == k, perm, 0), axis=0)
        perm_p = tl.sum(tl.where(r == p, perm, 0), axis=0)
        perm = tl.where(r == k, perm_p, tl.where(r == p, perm_k, perm))
    b_mask = (rows < n) & (kc[None, :] < K)
    Y = tl.load(b_ptr + pid * n * K + perm[:, None] * K + kc[None, :], mask=b_mask, other=0.0)
    for j in range(n):  # forward: L y = P b, column j of L at a time
        l_j = tl.sum(tl.where((cols == j) & (rows > j), LU, 0.0), axis=1)  # [NP]
        y_j = tl.sum(tl.where(rows == j, Y, 0.0), axis=0)  # final row j of y     [KP]
        Y = Y - l_j[:, None] * y_j[None, :]
    for jj in range(n):  # back: U x = y, from the last row up
        j = n - 1 - jj
        u_j = tl.sum(tl.where(cols == j, LU, 0.0), axis=1)  # column j of U (and L below)
        u_jj = tl.sum(tl.where(r == j, u_j, 0.0), axis=0)
        x_j = tl.sum(tl.where(rows == j, Y, 0.0), axis=0) / u_jj  # [KP]
        Y = tl.where(rows == j, x_j[None, :], Y - tl.where(r < j, u_j, 0.0)[:, None] * x_j[None, :])
    Y = tl.where(bad == 0, Y, float("nan"))
    tl.store(x_ptr + pid * n * K + rows * K + kc[None, :], Y, mask=b_mask)
# --8<-- [end:lu_solve_kernel]


# --8<-- [start:reflector]
@triton.jit
def _reflector(col, k, r):
    """v with v^T v = 2 and (I - v v^T) x = beta e_1 for x = col[k:]; v is zero above row k.

    Also returns f with v[k+1:] = f x[k+1:]. If col[k+1:] is already zero, v = 0 (H = I) and
    beta = col[k], as LAPACK's larfg; a NaN in col[k+1:] is not zero, so beta is NaN (as larfg).
    """
    x = tl.where(r >= k, col, 0.0)  # [MP]
    x_1 = tl.sum(tl.where(r == k, x, 0.0), axis=0)
    tail2 = tl.sum(tl.where(r > k, x * x, 0.0), axis=0)
    norm_x = tl.sqrt(x_1 * x_1 + tail2)
    s = tl.where(x_1 >= 0.0, 1.0, -1.0)
    v = tl.where(r == k, x + s * norm_x, x)  # v = x + sign(x_1) ||x|| e_1
    norm_v2 = 2.0 * norm_x * (norm_x + tl.abs(x_1))  # = ||v||^2, without another reduction
    zero = tail2 == 0.0  # nothing to zero: H = I
    f = tl.where(zero, 0.0, tl.sqrt(2.0 / tl.where(zero, 1.0, norm_v2)))
    return v * f, tl.where(zero, x_1, -s * norm_x), f  # now v^T v = 2
# --8<-- [end:reflector]


# --8<-- [start:qr_kernel]
@triton.jit
def _qr_kernel(
    a_ptr,  # *fp32 [B, m, n] contiguous input
    q_ptr,  # *fp32 [B, m, p] output, p = min(m, n) (unused unless WANT_Q)
    r_ptr,  # *fp32 [B, p, n] output
    m,
    n,
    p,  # min(m, n): the number of reflectors
    WANT_Q: tl.constexpr,
    MP: tl.constexpr,  # row tile, a power of two >= m
    NP: tl.constexpr,  # column tile, a power of two >= n
):
    pid = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, MP)
    c = tl.arange(0, NP)
    rows, cols = r[:, None], c[None, :]
    A = tl.load(a_ptr + pid * m * n + rows * n + cols, mask=(rows < m) & (cols < n), other=0.0)
    # Column k is left alone after step k: R_ik above the diagonal, x_i = v_k[i] / f_k below.
    r_diag = tl.zeros([NP], dtype=tl.float32)  # beta_k = R_kk
    v_diag = tl.zeros([NP], dtype=tl.float32)  # v_k[k]
    scale = tl.zeros([NP], dtype=tl.float32)  # f_k: v_k[i] = f_k x_i for i > k
    for k in range(p):
        col = tl.sum(tl.where(cols == k, A, 0.0), axis=1)  # column k             [MP]
        v, beta, f = _reflector(col, k, r)  # [MP], scalars
        w = tl.where(c > k, tl.sum(v[:, None] * A, axis=0), 0.0)  # v^T A right of column k
        A = A - v[:, None] * w[None, :]  # H_k A = A - v (v^T A)
        r_diag = tl.where(c == k, beta, r_diag)
        v_diag = tl.where(c == k, tl.sum(tl.where(r == k, v, 0.0), axis=0), v_diag)
        scale = tl.where(c == k, f, scale)
    R = tl.where(cols > rows, A, tl.where(cols == rows, r_diag[None, :], 0.0))
    tl.store(r_ptr + pid * p * n + rows * n + cols, R, mask=(rows < p) & (cols < n))
    if WANT_Q:
        Q = tl.where((rows == cols) & (rows < m), 1.0, 0.0)  # [I_p; 0]    [MP, NP]
        for kk in range(p):  # Q = H_1 (H_2 (... (H_p [I; 0]))), last reflector first
            k = p - 1 - kk
            v_k = tl.sum(tl.where(c == k, v_diag, 0.0), axis=0)
            s_k = tl.sum(tl.where(c == k, scale, 0.0), axis=0)
            v = tl.sum(tl.where(cols == k, A, 0.0), axis=1) * s_k
            v = tl.where(r > k, v, tl.where(r == k, v_k, 0.0))  # [MP]
            Q = Q - v[:, None] * tl.sum(v[:, None] * Q, axis=0)[None, :]
        tl.store(q_ptr + pid * m * p + rows * p + cols, Q, mask=(rows < m) & (cols < p))
# --8<-- [end:qr_kernel]


# --8<-- [start:lstsq_kernel]
@triton.jit
def _lstsq_kernel(
    a_ptr,  # *fp32 [B, m, n], m >= n
    b_ptr,  # *fp32 [B, m, K]
    x_ptr,  # *fp32 [B, n, K] output (NaN where rank < n)
    res_ptr,  # *fp32 [B, K] output: ||A x - b||^2 per column (if WANT_RES; NaN where rank < n)
    rank_ptr,  # *int64 [B] output: the number of R_jj with |R_jj| > tol max_i |R_ii|
    m,
    n,
    K,
    tol,  # relative threshold on the diagonal of R
    WANT_RES: tl.constexpr,  # m > n: the residuals are the rows n..m of Q^T B
    MP: tl.constexpr,
    NP: tl.constexpr,
    KP: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, MP)
    c = tl.arange(0, NP)
    kc = tl.arange(0, KP)
    rows, cols, rhs = r[:, None], c[None, :], kc[None, :]
    A = tl.load(a_ptr + pid * m * n + rows * n + cols, mask=(rows < m) & (cols < n), other=0.0)
    B = tl.load(b_ptr + pid * m * K + rows * K + rhs, mask=(rows < m) & (rhs < K), other=0.0)
    r_diag = tl.zeros([NP], dtype=tl.float32)
    for k in range(n):  # A = Q R and B <- Q^T B, reflector by reflector
        v, beta, _ = _reflector(tl.sum(tl.where(cols == k, A, 0.0), axis=1), k, r)
        w = tl.where(c > k, tl.sum(v[:, None] * A, axis=0), 0.0)
        A = A - v[:, None] * w[None, :]  # column k keeps stale values below row k: unused
        B = B - v[:, None] * tl.sum(v[:, None] * B, axis=0)[None, :]
        r_diag = tl.where(c == k, beta, r_diag)
    # R and (Q^T B)[:n] live in the first NP rows: cut them out once, then solve on small tiles
    top = tl.arange(0, MP // NP)[:, None, None] == 0
    R = tl.sum(tl.where(top, tl.reshape(A, [MP // NP, NP, NP]), 0.0), axis=0)  # [NP, NP]
    C = tl.sum(tl.where(top, tl.reshape(B, [MP // NP, NP, KP]), 0.0), axis=0)  # [NP, KP]
    rn = tl.arange(0, NP)
    for jj in range(n):  # R X = C, from the last row up, in place in C
        j = n - 1 - jj
        r_j = tl.sum(tl.where(cols == j, R, 0.0), axis=1)  # column j of R   [NP]
        r_jj = tl.sum(tl.where(c == j, r_diag, 0.0), axis=0)
        r_jj = tl.where(r_jj != 0.0, r_jj, 1.0)  # R_jj = 0 is reported by rank below
        x_j = tl.sum(tl.where(rn[:, None] == j, C, 0.0), axis=0) / r_jj  # [KP]
        C = tl.where(rn[:, None] == j, x_j[None, :],
                     C - tl.where(rn < j, r_j, 0.0)[:, None] * x_j[None, :])
    size = tl.abs(r_diag)
    # a NaN in A makes R_jj NaN from its column on: it compares false, so it is flagged apart
    # (and left out of the max: tl.max leaves what a NaN does unspecified)
    big = tl.max(tl.where(size == size, size, 0.0), axis=0)
    small = ((size <= tol * big) | (size != size)) & (c < n)
    deficient = tl.sum(small.to(tl.int32), axis=0)
    C = tl.where(deficient > 0, float("nan"), C)  # never silently wrong: no solution
    tl.store(x_ptr + pid * n * K + rn[:, None] * K + rhs, C, mask=(rn[:, None] < n) & (rhs < K))
    tl.store(rank_ptr + pid, (n - deficient).to(tl.int64))
    if WANT_RES:  # rows n..m of Q^T B are what no x can reach: ||A x - b||^2 = their sum
        res = tl.sum(tl.where(rows >= n, B * B, 0.0), axis=0)  # [KP]
        res = tl.where(deficient > 0, float("nan"), res)
        tl.store(res_ptr + pid * K + kc, res, mask=kc < K)
# --8<-- [end:lstsq_kernel]


# --8<-- [start:launch_common]
def _pow2(x: int) -> int:
    return max(2, next_power_of_2(x))


def _default_config(tile_elems: int) -> triton.Config:
    """About 8 to 16 tile elements per thread: the choice when autotuning is off (interpreter)."""
    warps = min(8, max(1, tile_elems // (32 * 16)))
    return triton.Config({}, num_warps=warps)


def _launch(kernel, tuned, grid, args: tuple, meta: dict, config: triton.Config | None,
            tile_elems: int, count: int | None = None) -> None:
    if (grid[0] if count is None else count) == 0:
        return
    if config is None and not interpreted(kernel):
        tuned[grid](*args, **meta)
        return
    config = config or _default_config(tile_elems)
    kernel[grid](*args, **meta, **config.kwargs, num_warps=config.num_warps)
# --8<-- [end:launch_common]


# --8<-- [start:lu_factor]
# n <= 32 goes to the row-per-lane kernel, one warp per 32 rows: a 32 x 32 matrix per warp, two
# 16 x 16 ones, and so on (on the H200 the fastest of MATS 1, 2, 4 at n = 16 and 32). Larger n
# goes to the whole-tile kernel, whose warps the autotuner picks as for QR.
ROWS_MAX_N = 32
LU_CONFIGS = [triton.Config({"MATS": 1}, num_warps=w) for w in (1, 2, 4, 8, 16)]
_lu_factor_tuned = triton.autotune(
    LU_CONFIGS, key=["n"], prune_configs_by={"early_config_prune": _prune})(_lu_factor_kernel)


def rows_config(NP: int) -> triton.Config:
    """The row-per-lane kernel's launch for an NP-wide tile: one warp, 32 // NP matrices.

    Args:
        NP: the tile width, a power of two <= 32.

    Returns:
        A ``triton.Config`` with ``MATS = max(1, 32 // NP)`` and one warp.
    """
    return triton.Config({"MATS": max(1, 32 // NP)}, num_warps=1)


def _launch_lu_factor(A: torch.Tensor, config: triton.Config | None = None):
    """LU, pivots, info of A [..., n, n] (checked by the caller): getrf, batched.

    config: None (n <= 32: one warp per 32 rows; larger n: autotuned on the GPU) or a
    ``triton.Config`` with num_warps and MATS (matrices per program).
    """
    n = A.shape[-1]
    batch = A.shape[:-2]
    a = A.reshape(-1, n, n).contiguous()
    lu = torch.empty((*batch, n, n), dtype=torch.float32, device=A.device)
    piv = torch.empty((*batch, n), dtype=torch.int32, device=A.device)
    info = torch.empty(batch, dtype=torch.int32, device=A.device)
    NP, B = _pow2(n), a.shape[0]
    kernel = _lu_factor_kernel
    if n <= ROWS_MAX_N:  # not tuned: one warp per 32 rows
        kernel = _lu_factor_rows_kernel
        config = config or rows_config(NP)
    if config is not None or interpreted(kernel):  # a fixed launch: MATS 1 unless set
        config = config or _default_config(NP * NP)
        config = triton.Config({"MATS": 1, **config.kwargs}, num_warps=config.num_warps)
    _launch(kernel, _lu_factor_tuned, lambda meta: (cdiv(B, meta["MATS"]),),
            (a, lu, piv, info, n, B), {"NP": NP}, config, NP * NP, B)
    return lu, piv, info
# --8<-- [end:lu_factor]


# --8<-- [start:lu_solve]
_lu_solve_tuned = _autotune(["n", "K"])(_lu_solve_kernel)


def _launch_lu_solve(LU: torch.Tensor, pivots: torch.Tensor, B: torch.Tensor,
                     config: triton.Config | None = None) -> torch.Tensor:
    """X = U^{-1} L^{-1} P B (getrs) for LU [..., n, n], pivots [..., n], B [..., n, k] of one
    batch shape (checked by the caller)."""
    n, k = B.shape[-2:]
    batch = LU.shape[:-2]
    x = torch.empty((*batch, n, k), dtype=torch.float32, device=LU.device)
    lu = LU.reshape(-1, n, n).contiguous()
    NP, KP = _pow2(n), _pow2(k)
    _launch(_lu_solve_kernel, _lu_solve_tuned, (lu.shape[0],),
            (lu, pivots.reshape(-1, n).contiguous(), B.reshape(-1, n, k).contiguous(), x, n, k),
            {"NP": NP, "KP": KP}, config, NP * max(NP, KP))
    return x
# --8<-- [end:lu_solve]


# --8<-- [start:qr]
_qr_tuned = _autotune(["m", "n", "WANT_Q"])(_qr_kernel)


def _launch_qr(A: torch.Tensor, want_q: bool = True, config: triton.Config | None = None):
    """Q [..., m, p] (empty unless want_q) and R [..., p, n] of A [..., m, n], p = min(m, n):
    geqrf + orgqr (checked by the caller)."""
    m, n = A.shape[-2:]
    p = min(m, n)
    batch = A.shape[:-2]
    a = A.reshape(-1, m, n).contiguous()
    r = torch.empty((*batch, p, n), dtype=torch.float32, device=A.device)
    q = (torch.empty((*batch, m, p), dtype=torch.float32, device=A.device) if want_q
         else A.new_empty(0))
    MP, NP = _pow2(m), _pow2(n)
    _launch(_qr_kernel, _qr_tuned, (a.shape[0],), (a, q if want_q else r, r, m, n, p),
            {"WANT_Q": want_q, "MP": MP, "NP": NP}, config, MP * NP)
    return q, r
# --8<-- [end:qr]


# --8<-- [start:lstsq]
_lstsq_tuned = _autotune(["m", "n", "K", "WANT_RES"])(_lstsq_kernel)


def _launch_lstsq(A: torch.Tensor, B: torch.Tensor, rcond: float,
                  config: triton.Config | None = None):
    """solution [..., n, k], residuals ([..., k] if m > n, else empty), rank [...] (int64) for
    A [..., m, n], m >= n, and B [..., m, k] of one batch shape (checked by the caller)."""
    m, n = A.shape[-2:]
    k = B.shape[-1]
    batch = A.shape[:-2]
    x = torch.empty((*batch, n, k), dtype=torch.float32, device=A.device)
    want_res = m > n
    res = torch.empty((*batch, k) if want_res else (0,), dtype=torch.float32, device=A.device)
    rank = torch.empty(batch, dtype=torch.int64, device=A.device)
    MP, NP, KP = _pow2(m), _pow2(n), _pow2(k)
    _launch(_lstsq_kernel, _lstsq_tuned, (x.numel() // (n * k),),
            (A.reshape(-1, m, n).contiguous(), B.reshape(-1, m, k).contiguous(), x,
             res if want_res else x, rank, m, n, k, rcond),
            {"WANT_RES": want_res, "MP": MP, "NP": NP, "KP": KP}, config, MP * max(NP, KP))
    return x, res, rank
# --8<-- [end:lstsq]


# --8<-- [start:ops]
# Each launcher becomes a PyTorch custom operator (namespace kernelnotes) with a fake
# implementation, so torch.compile and FakeTensorMode see shapes without running Triton, and a
# backward made of torch ops. Only the fp32 Triton launch happens inside the operator.
@torch.library.custom_op("kernelnotes::lu_factor_ex", mutates_args=())
def _lu_factor_ex_op(A: torch.Tensor, check_errors: bool) -> tuple[torch.Tensor, torch.Tensor,
                                                                     torch.Tensor]:
    LU, pivots, info = _launch_lu_factor(A)
    if check_errors and A.numel() > 0:  # inside the operator: a host sync Dynamo never sees
        bad = torch.nonzero(info.reshape(-1))
        if bad.numel():
            i = int(info.reshape(-1)[bad[0, 0]])
            raise RuntimeError(
                f"kernelnotes.linalg.lu_factor: U[{i - 1},{i - 1}] is zero (batch element "
                f"{int(bad[0, 0])}) and lu_solve would divide by it; use lu_factor_ex to get the "
                "factors with info")
    return LU, pivots, info


@_lu_factor_ex_op.register_fake
def _(A, check_errors):
    return (torch.empty_like(A, memory_format=torch.contiguous_format),
            A.new_empty((*A.shape[:-1],), dtype=torch.int32),
            A.new_empty(A.shape[:-2], dtype=torch.int32))


def _lu_factor_setup(ctx, inputs, output):
    LU, pivots, _ = output
    ctx.save_for_backward(LU, pivots)


def _lu_factor_backward(ctx, gLU, gpivots, ginfo):
    # A = P L U; for gLU = gL + gU: gA = P L^{-T} (tril(L^T gL, -1) + triu(gU U^T)) U^{-T}
    LU, pivots = ctx.saved_tensors
    if gLU is None:
        return None, None
    P, L, U = torch.lu_unpack(LU, pivots)
    phi = (L.mT @ gLU.tril(-1)).tril(-1) + (gLU.triu() @ U.mT).triu()
    Y = torch.linalg.solve_triangular(L.mT, phi, upper=True, unitriangular=True)
    return P @ torch.linalg.solve_triangular(U.mT, Y, upper=False, left=False), None


_lu_factor_ex_op.register_autograd(_lu_factor_backward, setup_context=_lu_factor_setup)


@torch.library.custom_op("kernelnotes::lu_solve", mutates_args=())
def _lu_solve_op(LU: torch.Tensor, pivots: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    return _launch_lu_solve(LU, pivots, B)


@_lu_solve_op.register_fake
def _(LU, pivots, B):
    return B.new_empty(B.shape)


def _lu_solve_setup(ctx, inputs, output):
    LU, pivots, _ = inputs
    ctx.save_for_backward(LU, pivots, output)


def _lu_solve_backward(ctx, gX):
    # X = A^{-1} B with A = P L U: gB = A^{-T} gX, gA = -gB X^T, and gLU from gA as in lu_factor
    LU, pivots, X = ctx.saved_tensors
    gB = torch.linalg.lu_solve(LU, pivots, gX, adjoint=True)
    gLU = None
    if ctx.needs_input_grad[0]:
        P, L, U = torch.lu_unpack(LU, pivots)
        PtgA = -(P.mT @ gB) @ X.mT
        gLU = (PtgA @ U.mT).tril(-1) + (L.mT @ PtgA).triu()
    return gLU, None, gB


_lu_solve_op.register_autograd(_lu_solve_backward, setup_context=_lu_solve_setup)


@torch.library.custom_op("kernelnotes::qr", mutates_args=())
def _qr_op(A: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch_qr(A, want_q=mode == "reduced")


@_qr_op.register_fake
def _(A, mode):
    m, n = A.shape[-2:]
    p = min(m, n)
    Q = A.new_empty((*A.shape[:-2], m, p)) if mode == "reduced" else A.new_empty(0)
    return Q, A.new_empty((*A.shape[:-2], p, n))


def _qr_setup(ctx, inputs, output):
    A, mode = inputs
    ctx.mode = mode
    ctx.save_for_backward(A, *output)


def _qr_backward_square(gQ, gR, Q, R):
    # m >= n, A = QR: gA = (gQ + Q copyltu(M)) R^{-T}, M = R gR^T - gQ^T Q (Liao et al., 2019,
    # arXiv:1903.09650, eq. 7), copyltu(M) = tril(M) + tril(M, -1)^T
    M = R @ gR.mT - gQ.mT @ Q
    M = M.tril() + M.tril(-1).mT
    return torch.linalg.solve_triangular(R.mT, gQ + Q @ M, upper=False, left=False)


def _qr_backward(ctx, gQ, gR):
    A, Q, R = ctx.saved_tensors
    if ctx.mode == "r":  # Q was not returned; the backward needs it: compute it again
        Q, R = torch.ops.kernelnotes.qr(A, "reduced")
        gQ = None
    m, n = A.shape[-2:]
    gQ = torch.zeros_like(Q) if gQ is None else gQ
    gR = torch.zeros_like(R) if gR is None else gR
    if m >= n:
        return _qr_backward_square(gQ, gR, Q, R), None
    # wide: A = Q [R1, R2] with X = A[:, :m] = Q R1, Y = A[:, m:] = Q R2 (Liao et al., eq. 9)
    Y, gR1, gR2 = A[..., m:], gR[..., :m], gR[..., m:]
    gX = _qr_backward_square(gQ + Y @ gR2.mT, gR1, Q, R[..., :m])
    return torch.cat([gX, Q @ gR2], dim=-1), None


_qr_op.register_autograd(_qr_backward, setup_context=_qr_setup)


@torch.library.custom_op("kernelnotes::lstsq", mutates_args=())
def _lstsq_op(A: torch.Tensor, B: torch.Tensor, rcond: float) -> tuple[
        torch.Tensor, torch.Tensor, torch.Tensor]:
    return _launch_lstsq(A, B, rcond)


@_lstsq_op.register_fake
def _(A, B, rcond):
    m, n = A.shape[-2:]
    k = B.shape[-1]
    res = B.new_empty((*B.shape[:-2], k) if m > n else (0,))
    return (B.new_empty((*B.shape[:-2], n, k)), res,
            A.new_empty(A.shape[:-2], dtype=torch.int64))


def _lstsq_setup(ctx, inputs, output):
    A, B, _ = inputs
    X, res, _ = output
    ctx.save_for_backward(A, B, X)


def _lstsq_backward(ctx, gX, gres, grank):
    # X = (A^T A)^{-1} A^T B, r = B - A X. With G = (A^T A)^{-1} gX = R^{-1} R^{-T} gX:
    # gB = A G, gA = r G^T - A G X^T. The residuals ||r_j||^2 are minima over x, so only their
    # explicit dependence counts: gB += 2 r gres, gA -= 2 r gres X^T.
    A, B, X = ctx.saved_tensors
    _, R = torch.ops.kernelnotes.qr(A, "r")
    r = B - A @ X
    gX = torch.zeros_like(X) if gX is None else gX
    G = torch.linalg.solve_triangular(
        R, torch.linalg.solve_triangular(R.mT, gX, upper=False), upper=True)
    AG = A @ G
    gA, gB = r @ G.mT - AG @ X.mT, AG
    if gres is not None and gres.numel():
        rg = 2 * r * gres[..., None, :]
        gA, gB = gA - rg @ X.mT, gB + rg
    return gA, gB, None


_lstsq_op.register_autograd(_lstsq_backward, setup_context=_lstsq_setup)
# --8<-- [end:ops]


# --8<-- [start:api]
class LUFactor(NamedTuple):
    """What `lu_factor` returns, as ``torch.linalg.lu_factor``."""

    LU: torch.Tensor
    pivots: torch.Tensor


class LUFactorEx(NamedTuple):
    """What `lu_factor_ex` returns, as ``torch.linalg.lu_factor_ex``."""

    LU: torch.Tensor
    pivots: torch.Tensor
    info: torch.Tensor


class QR(NamedTuple):
    """What `qr` returns, as ``torch.linalg.qr``."""

    Q: torch.Tensor
    R: torch.Tensor


class Lstsq(NamedTuple):
    """What `lstsq` returns, with the fields of ``torch.linalg.lstsq``."""

    solution: torch.Tensor
    residuals: torch.Tensor
    rank: torch.Tensor
    singular_values: torch.Tensor


def _check_flag(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def _check_matrix(name: str, t, max_rows: int, max_cols: int, kernel) -> None:
    check_tensor(name, t, dtypes=(torch.float32,), min_ndim=2)
    if not (1 <= t.shape[-2] <= max_rows and 1 <= t.shape[-1] <= max_cols):
        raise ValueError(f"{name} must be [..., m, n] with 1 <= m <= {max_rows} and "
                         f"1 <= n <= {max_cols}, got shape {tuple(t.shape)}")
    check_kernel_device(name, t, kernel)


def _batch_shape(name: str, M: torch.Tensor, B: torch.Tensor) -> torch.Size:
    """The broadcast batch shape of matrix M and right-hand sides B, or a ValueError naming both."""
    try:
        return torch.broadcast_shapes(M.shape[:-2], B.shape[:-2])
    except RuntimeError:
        raise ValueError(f"B's batch shape {tuple(B.shape[:-2])} does not broadcast with {name}'s "
                         f"{tuple(M.shape[:-2])}") from None


def _check_square(name: str, t, kernel) -> int:
    """t [..., n, n] float32 with 1 <= n <= MAX_N on kernel's device; returns n."""
    _check_matrix(name, t, MAX_N, MAX_N, kernel)
    if t.shape[-2] != t.shape[-1]:
        raise ValueError(f"{name} must be square [..., n, n], got shape {tuple(t.shape)}")
    return t.shape[-1]


def _check_pivot(pivot) -> None:
    _check_flag("pivot", pivot)
    if not pivot:
        raise ValueError("pivot=False (LU without pivoting) is not supported: pass pivot=True")


def lu_factor_ex(A: torch.Tensor, *, pivot: bool = True, check_errors: bool = False
                 ) -> LUFactorEx:
    """P A = L U with partial pivoting for a batch of small matrices, as
    ``torch.linalg.lu_factor_ex`` (LAPACK getrf, batched).

    Gaussian elimination with partial pivoting (Golub and Van Loan, Matrix Computations, 4th ed.,
    Alg. 3.4.1), packed as torch packs it. A custom operator ``kernelnotes::lu_factor_ex``:
    works under ``torch.compile`` and ``FakeTensorMode``; differentiable with respect to A
    through LU (the backward of ``torch.linalg.lu_factor``, in torch ops).

    Args:
        A: [..., n, n] float32, 1 <= n <= 64, any batch shape (an empty batch too); CUDA (CPU
            under the Triton interpreter).
        pivot: must be True (partial pivoting); False is refused.
        check_errors: raise a RuntimeError if some U has an exactly zero pivot (a host sync).

    Returns:
        ``LUFactorEx(LU, pivots, info)``: LU [..., n, n] float32, U on and above the diagonal and
        the multipliers of L below it; pivots [..., n] int32, 1-based: step k swapped rows k and
        pivots[k] - 1; info [...] int32, 0, or i > 0 if U[i-1, i-1] is exactly zero (the first).

    Raises:
        TypeError: A is not a float32 tensor, or a flag is not a bool.
        ValueError: A is not [..., n, n] with 1 <= n <= 64, is on a device the kernels cannot use,
            or pivot is False.
        RuntimeError: check_errors is True and some A is singular (info > 0).
    """
    _check_square("A", A, _lu_factor_kernel)
    _check_pivot(pivot)
    _check_flag("check_errors", check_errors)
    return LUFactorEx(*torch.ops.kernelnotes.lu_factor_ex(A, check_errors))


def lu_factor(A: torch.Tensor, *, pivot: bool = True) -> LUFactor:
    """P A = L U with partial pivoting, as ``torch.linalg.lu_factor``: `lu_factor_ex`
    without info, raising where A is singular.

    Args:
        A: [..., n, n] float32, 1 <= n <= 64; CUDA (CPU under the Triton interpreter).
        pivot: must be True.

    Returns:
        ``LUFactor(LU, pivots)`` as in `lu_factor_ex`.

    Raises:
        TypeError: A is not a float32 tensor, or pivot is not a bool.
        ValueError: A is not [..., n, n] with 1 <= n <= 64, or is on the wrong device.
        RuntimeError: some U has an exactly zero pivot (checked on the host, as torch does).
    """
    _check_square("A", A, _lu_factor_kernel)
    _check_pivot(pivot)
    LU, pivots, _ = torch.ops.kernelnotes.lu_factor_ex(A, True)
    return LUFactor(LU, pivots)


def lu_solve(LU: torch.Tensor, pivots: torch.Tensor, B: torch.Tensor, *, left: bool = True,
             adjoint: bool = False) -> torch.Tensor:
    """X with A X = B from `lu_factor`'s output, as ``torch.linalg.lu_solve``:
    X = U^{-1} L^{-1} P B (LAPACK getrs).

    Differentiable with respect to B and LU (torch's formulas, in torch ops).

    Args:
        LU: [..., n, n] float32, 1 <= n <= 64, and pivots: [..., n] int32, as returned by
            `lu_factor`.
        B: [..., n, k] float32, 1 <= k <= 64; batch shapes broadcast as in torch.
        left: must be True (X A = B is not supported).
        adjoint: must be False (A^T X = B is not supported).

    Returns:
        X: [..., n, k] float32 (inf/NaN where U has a zero pivot, as getrs; all NaN for a batch
        element whose pivots are not lu_factor's, pivots[k] outside [k + 1, n]).

    Raises:
        TypeError: a tensor has the wrong type or dtype, or a flag is not a bool.
        ValueError: shapes do not fit, a tensor is on another device, or left/adjoint ask for
            what the kernel does not do.
    """
    n = _check_square("LU", LU, _lu_solve_kernel)
    check_tensor("pivots", pivots, dtypes=(torch.int32,), min_ndim=1, device=LU.device)
    check_tensor("B", B, dtypes=(torch.float32,), min_ndim=2, device=LU.device)
    _check_flag("left", left)
    _check_flag("adjoint", adjoint)
    if not left or adjoint:
        raise ValueError(f"left={left}, adjoint={adjoint}: only left=True, adjoint=False "
                         "(A X = B) is supported")
    if pivots.shape[-1] != n or pivots.shape[:-1] != LU.shape[:-2]:
        raise ValueError(f"pivots must have shape {(*LU.shape[:-2], n)}, "
                         f"got {tuple(pivots.shape)}")
    if B.shape[-2] != n or not 1 <= B.shape[-1] <= MAX_K:
        raise ValueError(f"B must be [..., {n}, k] with 1 <= k <= {MAX_K}, "
                         f"got shape {tuple(B.shape)}")
    batch = _batch_shape("LU", LU, B)
    LU = LU.expand(*batch, n, n)
    pivots = pivots.expand(*batch, n)
    B = B.expand(*batch, *B.shape[-2:])
    return torch.ops.kernelnotes.lu_solve(LU, pivots, B)


def qr(A: torch.Tensor, mode: str = "reduced") -> QR:
    """A = Q R by Householder reflections for a batch of small matrices, as
    ``torch.linalg.qr`` (LAPACK geqrf + orgqr).

    Householder QR (Golub and Van Loan, Matrix Computations, 4th ed., Alg. 5.2.1) with reflectors
    H = I - v v^T, v^T v = 2; R's diagonal has LAPACK's signs, R_kk = -sign(a_kk) ||x||.
    Differentiable with respect to A (Liao et al., 2019, in torch ops), for full-rank A; in mode
    "r" too (the backward forms Q again).

    Args:
        A: [..., m, n] float32, 1 <= m <= 256, 1 <= n <= 64.
        mode: "reduced" (Q [..., m, p] and R [..., p, n], p = min(m, n)), "r" (R only; Q is an
            empty tensor, as in torch), or "complete" for m <= n, where it equals "reduced"
            (for m > n the full m x m Q is not computed: refused).

    Returns:
        ``QR(Q, R)``, float32.

    Raises:
        TypeError: A is not a float32 tensor, or mode is not a str.
        ValueError: A's shape or device does not fit, or mode is not one of the above.
    """
    _check_matrix("A", A, MAX_M, MAX_N, _qr_kernel)
    if not isinstance(mode, str):
        raise TypeError(f"mode must be a str, got {type(mode).__name__}")
    m, n = A.shape[-2:]
    if mode == "complete" and m > n:
        raise ValueError(f"mode='complete' needs the full {m} x {m} Q, which is not computed: "
                         "use mode='reduced' (or 'r')")
    if mode not in ("reduced", "r", "complete"):
        raise ValueError(f"mode must be 'reduced', 'r' or 'complete', got {mode!r}")
    return QR(*torch.ops.kernelnotes.qr(A, "r" if mode == "r" else "reduced"))


def lstsq(A: torch.Tensor, B: torch.Tensor, rcond: float | None = None, *,
          driver: str | None = None) -> Lstsq:
    """min_X ||A X - B||_F for a batch of small tall matrices by Householder QR, as
    ``torch.linalg.lstsq`` with driver "gels".

    R X = (Q^T B)[:n] by back substitution; Q is applied to B reflector by reflector, never formed.
    rank counts the |R_jj| > rcond max_i |R_ii|. QR without column pivoting is not rank-revealing
    in general, but an exactly rank-deficient A always shows in it; a NaN in A counts as a lost
    rank. Where rank < n the solution (and residuals) are NaN: never silently wrong.
    Differentiable with respect to A and B (full-rank A, in torch ops).

    Args:
        A: [..., m, n] float32, 1 <= n <= m <= 256, n <= 64.
        B: [..., m, k] float32, 1 <= k <= 64, or [..., m] (one right-hand side; the solution is
            then [..., n]); batch shapes broadcast as in torch.
        rcond: the threshold, a finite number >= 0; default (None) max(m, n) times float32's
            machine epsilon 2^-23, as torch.
        driver: None or "gels" (what this is); others are refused.

    Returns:
        ``Lstsq(solution, residuals, rank, singular_values)``: solution [..., n, k] float32;
        residuals [..., k] float32, ||A x - b||^2 per column, for m > n (empty for m = n, as
        torch); rank [...] int64; singular_values empty (not computed, as with "gels").

    Raises:
        TypeError: a tensor has the wrong type or dtype, or rcond is not a real number.
        ValueError: shapes or devices do not fit, A is wide, rcond is negative or not finite, or
            driver is not "gels".
    """
    _check_matrix("A", A, MAX_M, MAX_N, _lstsq_kernel)
    m, n = A.shape[-2:]
    if m < n:
        raise ValueError(f"A must be tall (m >= n) for least squares, got shape {tuple(A.shape)}")
    check_tensor("B", B, dtypes=(torch.float32,), min_ndim=1, device=A.device)
    if driver not in (None, "gels"):
        raise ValueError(f"driver must be None or 'gels', got {driver!r}")
    vector = B.ndim == A.ndim - 1
    if vector:
        B = B[..., None]
    if B.ndim < 2 or B.shape[-2] != m or not 1 <= B.shape[-1] <= MAX_K:
        raise ValueError(f"B must be [..., {m}, k] with 1 <= k <= {MAX_K} or [..., {m}], "
                         f"got shape {tuple(B.shape[:-1] if vector else B.shape)}")
    batch = _batch_shape("A", A, B)
    tol = max(m, n) * EPS_FP32 if rcond is None else check_real("rcond", rcond,
                                                               "a finite number >= 0")
    A = A.expand(*batch, m, n)
    B = B.expand(*batch, *B.shape[-2:])
    X, res, rank = torch.ops.kernelnotes.lstsq(A, B, tol)
    if vector:
        X = X[..., 0]
    return Lstsq(X, res, rank, A.new_empty(0))
# --8<-- [end:api]


def row_permutation(pivots: torch.Tensor) -> torch.Tensor:
    """The row order of P A from lu_factor's pivots (the row swaps replayed in order, as
    LAPACK's ?laswp applies them).

    Args:
        pivots: [B, n] int32 or int64, 1-based sequential pivots.

    Returns:
        perm: [B, n] int64 with (P A)[i] = A[perm[i]].
    """
    check_tensor("pivots", pivots, dtypes=(torch.int32, torch.int64), ndim=2)
    batch, n = pivots.shape
    perm = torch.arange(n, device=pivots.device).repeat(batch, 1)
    idx = torch.arange(batch, device=pivots.device)
    for k in range(n):
        p = pivots[:, k].long() - 1
        pk, pp = perm[:, k].clone(), perm[idx, p].clone()
        perm[:, k], perm[idx, p] = pp, pk
    return perm
