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

Order: the jit helpers and kernels, then the torch-facing launchers ``lu_factor``, ``lu_solve``,
``qr`` and ``lstsq``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernelnotes._grid import cdiv, next_power_of_2
from kernelnotes._validate import check_kernel_device, check_real, check_tensor, interpreted

# --8<-- [start:setup]
MAX_N = 64  # columns (and rows of square inputs); the tile is next_pow2(n) wide
MAX_M = 256  # rows of qr / lstsq inputs
MAX_K = 64  # right-hand sides of lu_solve / lstsq
U_FP32 = 2.0**-24  # unit roundoff of float32

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
    x_ptr,  # *fp32 [B, n, K] output (NaN where info > 0)
    info_ptr,  # *int32 [B] output: 0, or i > 0 when |R_ii| <= tol max_j |R_jj| or R_ii is NaN
    m,
    n,
    K,
    tol,  # relative threshold on the diagonal of R for "rank-deficient"
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
        r_jj = tl.where(r_jj != 0.0, r_jj, 1.0)  # R_jj = 0 is reported by info below
        x_j = tl.sum(tl.where(rn[:, None] == j, C, 0.0), axis=0) / r_jj  # [KP]
        C = tl.where(rn[:, None] == j, x_j[None, :],
                     C - tl.where(rn < j, r_j, 0.0)[:, None] * x_j[None, :])
    size = tl.abs(r_diag)
    # a NaN in A makes R_jj NaN from its column on: it compares false, so it is flagged apart
    # (and left out of the max: tl.max leaves what a NaN does unspecified)
    big = tl.max(tl.where(size == size, size, 0.0), axis=0)
    small = ((size <= tol * big) | (size != size)) & (c < n)
    first = tl.min(tl.where(small, c, NP), axis=0)
    C = tl.where(first < NP, float("nan"), C)  # never silently wrong: no solution, and info says so
    tl.store(x_ptr + pid * n * K + rn[:, None] * K + rhs, C, mask=(rn[:, None] < n) & (rhs < K))
    tl.store(info_ptr + pid, tl.where(first < NP, first + 1, 0))
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


def _check_matrix(name: str, t, max_rows: int, max_cols: int) -> None:
    check_tensor(name, t, dtypes=(torch.float32,), min_ndim=2)
    if not (1 <= t.shape[-2] <= max_rows and 1 <= t.shape[-1] <= max_cols):
        raise ValueError(f"{name} must be [..., m, n] with 1 <= m <= {max_rows} and "
                         f"1 <= n <= {max_cols}, got shape {tuple(t.shape)}")


def _check_square(name: str, t, kernel) -> int:
    """t [..., n, n] float32 with 1 <= n <= MAX_N on kernel's device; returns n."""
    _check_matrix(name, t, MAX_N, MAX_N)
    check_kernel_device(name, t, kernel)
    if t.shape[-2] != t.shape[-1]:
        raise ValueError(f"{name} must be square [..., n, n], got shape {tuple(t.shape)}")
    return t.shape[-1]


def _out(name: str, given, shape: tuple, dtype, device) -> torch.Tensor:
    if given is None:
        return torch.empty(shape, dtype=dtype, device=device)
    check_tensor(name, given, dtypes=(dtype,), contiguous=True, device=device)
    if tuple(given.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(given.shape)}")
    return given
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
    """The row-per-lane kernel's launch for an NP-wide tile: one warp, 32 // NP matrices."""
    return triton.Config({"MATS": max(1, 32 // NP)}, num_warps=1)


def lu_factor(A: torch.Tensor, *, config: triton.Config | None = None, out=None):
    """P A = L U with partial pivoting for a batch of small matrices (LAPACK getrf, batched).

    Gaussian elimination with partial pivoting (Golub and Van Loan, Matrix Computations, 4th ed.,
    Alg. 3.4.1), packed as torch.linalg.lu_factor_ex packs it.

    Args:
        A: [..., n, n] float32, 1 <= n <= 64; CUDA (CPU under the Triton interpreter).
        config: a ``triton.Config`` (num_warps, and MATS: matrices per program) or None: for
            n <= 32 one warp per 32 rows, for larger n autotuned warps on the GPU.
        out: optional (LU, pivots, info) tensors to write into.
    Returns:
        LU: [..., n, n] float32, U on and above the diagonal, the multipliers of L below it.
        pivots: [..., n] int32, 1-based: step k swapped rows k and pivots[k] - 1.
        info: [...] int32, 0, or i > 0 if U[i-1, i-1] is exactly zero (A singular; the first i).
    """
    n = _check_square("A", A, _lu_factor_kernel)
    batch = A.shape[:-2]
    a = A.reshape(-1, n, n).contiguous()
    lu, piv, info = out if out is not None else (None, None, None)
    lu = _out("LU", lu, (*batch, n, n), torch.float32, A.device)
    piv = _out("pivots", piv, (*batch, n), torch.int32, A.device)
    info = _out("info", info, tuple(batch), torch.int32, A.device)
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


def lu_solve(LU: torch.Tensor, pivots: torch.Tensor, B: torch.Tensor, *,
             config: triton.Config | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """X with A X = B from lu_factor's output: X = U^{-1} L^{-1} P B (LAPACK getrs).

    Args:
        LU: [..., n, n] float32 and pivots: [..., n] int32, as returned by :func:`lu_factor`.
        B: [..., n, k] float32, 1 <= k <= 64, same batch shape as LU.
        config: a ``triton.Config`` or None to autotune on the GPU.
        out: optional [..., n, k] float32 output.
    Returns:
        X: [..., n, k] float32 (inf/NaN where U has a zero pivot, as in getrs; all NaN for a
        batch element whose pivots are not lu_factor's, pivots[k] outside [k + 1, n]).
    """
    n = _check_square("LU", LU, _lu_solve_kernel)
    batch = LU.shape[:-2]
    check_tensor("pivots", pivots, dtypes=(torch.int32,), device=LU.device)
    if tuple(pivots.shape) != (*batch, n):
        raise ValueError(f"pivots must have shape {(*batch, n)}, got {tuple(pivots.shape)}")
    _check_matrix("B", B, MAX_N, MAX_K)
    check_tensor("B", B, device=LU.device)
    if tuple(B.shape[:-1]) != (*batch, n):
        raise ValueError(f"B must be [..., {n}, k] with batch {tuple(batch)}, "
                         f"got shape {tuple(B.shape)}")
    k = B.shape[-1]
    x = _out("out", out, (*batch, n, k), torch.float32, LU.device)
    lu = LU.reshape(-1, n, n).contiguous()
    NP, KP = _pow2(n), _pow2(k)
    _launch(_lu_solve_kernel, _lu_solve_tuned, (lu.shape[0],),
            (lu, pivots.reshape(-1, n).contiguous(), B.reshape(-1, n, k).contiguous(), x, n, k),
            {"NP": NP, "KP": KP}, config, NP * max(NP, KP))
    return x
# --8<-- [end:lu_solve]


# --8<-- [start:qr]
_qr_tuned = _autotune(["m", "n", "WANT_Q"])(_qr_kernel)


def qr(A: torch.Tensor, mode: str = "reduced", *, config: triton.Config | None = None, out=None):
    """A = Q R by Householder reflections for a batch of small matrices (LAPACK geqrf + orgqr).

    Householder QR (Golub and Van Loan, Matrix Computations, 4th ed., Alg. 5.2.1) with reflectors
    H = I - v v^T, v^T v = 2; R's diagonal has LAPACK's signs, R_kk = -sign(a_kk) ||x||.

    Args:
        A: [..., m, n] float32, 1 <= m <= 256, 1 <= n <= 64.
        mode: "reduced" (Q [..., m, p] and R [..., p, n], p = min(m, n)) or "r" (R only; Q is an
            empty tensor, as in torch.linalg.qr).
        config: a ``triton.Config`` or None to autotune on the GPU.
        out: optional (Q, R) to write into (Q is ignored in mode "r").
    Returns:
        (Q, R) float32.
    """
    if mode not in ("reduced", "r"):
        raise ValueError(f"mode must be 'reduced' or 'r', got {mode!r}")
    _check_matrix("A", A, MAX_M, MAX_N)
    check_kernel_device("A", A, _qr_kernel)
    m, n = A.shape[-2:]
    p = min(m, n)
    batch = A.shape[:-2]
    a = A.reshape(-1, m, n).contiguous()
    q, r = out if out is not None else (None, None)
    want_q = mode == "reduced"
    q = _out("Q", q, (*batch, m, p), torch.float32, A.device) if want_q else A.new_empty(0)
    r = _out("R", r, (*batch, p, n), torch.float32, A.device)
    MP, NP = _pow2(m), _pow2(n)
    _launch(_qr_kernel, _qr_tuned, (a.shape[0],), (a, q if want_q else r, r, m, n, p),
            {"WANT_Q": want_q, "MP": MP, "NP": NP}, config, MP * NP)
    return q, r
# --8<-- [end:qr]


# --8<-- [start:lstsq]
_lstsq_tuned = _autotune(["m", "n", "K"])(_lstsq_kernel)


def lstsq(A: torch.Tensor, B: torch.Tensor, *, rtol: float | None = None,
          config: triton.Config | None = None, out=None):
    """min_X ||A X - B||_F for a batch of small tall matrices by Householder QR (LAPACK gels).

    R X = (Q^T B)[:n] by back substitution; Q is applied to B reflector by reflector, never formed.
    A is reported rank-deficient (info) when some |R_ii| <= rtol * max_j |R_jj|; QR without column
    pivoting is not rank-revealing in general, but an exactly rank-deficient A always trips it.

    Args:
        A: [..., m, n] float32, 1 <= n <= m <= 256, n <= 64.
        B: [..., m, k] float32, 1 <= k <= 64, same batch shape as A.
        rtol: the threshold, a finite number >= 0, default max(m, n) * 2^-24
            (numpy.linalg.matrix_rank's rule on R).
        config: a ``triton.Config`` or None to autotune on the GPU.
        out: optional (X, info) to write into.
    Returns:
        X: [..., n, k] float32, all NaN for a rank-deficient batch element.
        info: [...] int32, 0, or the first 1-based i with a too small (or NaN: A holds a NaN)
            |R_ii|.
    """
    _check_matrix("A", A, MAX_M, MAX_N)
    check_kernel_device("A", A, _lstsq_kernel)
    m, n = A.shape[-2:]
    if m < n:
        raise ValueError(f"A must be tall (m >= n) for least squares, got shape {tuple(A.shape)}")
    batch = A.shape[:-2]
    _check_matrix("B", B, MAX_M, MAX_K)
    check_tensor("B", B, device=A.device)
    if tuple(B.shape[:-1]) != (*batch, m):
        raise ValueError(f"B must be [..., {m}, k] with batch {tuple(batch)}, "
                         f"got shape {tuple(B.shape)}")
    k = B.shape[-1]
    rtol = max(m, n) * U_FP32 if rtol is None else check_real("rtol", rtol, "a finite number >= 0")
    x, info = out if out is not None else (None, None)
    x = _out("X", x, (*batch, n, k), torch.float32, A.device)
    info = _out("info", info, tuple(batch), torch.int32, A.device)
    MP, NP, KP = _pow2(m), _pow2(n), _pow2(k)
    _launch(_lstsq_kernel, _lstsq_tuned, (x.numel() // (n * k),),
            (A.reshape(-1, m, n).contiguous(), B.reshape(-1, m, k).contiguous(), x, info,
             m, n, k, rtol), {"MP": MP, "NP": NP, "KP": KP}, config, MP * max(NP, KP))
    return x, info
# --8<-- [end:lstsq]


def row_permutation(pivots: torch.Tensor) -> torch.Tensor:
    """perm [B, n] with (P A)[i] = A[perm[i]], from lu_factor's 1-based sequential pivots [B, n]
    (the row swaps replayed in order, as LAPACK's ?laswp applies them)."""
    check_tensor("pivots", pivots, dtypes=(torch.int32, torch.int64), ndim=2)
    batch, n = pivots.shape
    perm = torch.arange(n, device=pivots.device).repeat(batch, 1)
    idx = torch.arange(batch, device=pivots.device)
    for k in range(n):
        p = pivots[:, k].long() - 1
        pk, pp = perm[:, k].clone(), perm[idx, p].clone()
        perm[:, k], perm[idx, p] = pp, pk
    return perm
