"""Figures and tables of the LU/QR and linear-regression posts, computed at build time
(hooks/computed.py).

matplotlib and the benchmark results are read inside the functions, so importing this module
costs nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from kernelnotes._results import load, markdown_table, provenance
from kernelnotes.linalg.reference import cgs, form_q, householder_qr, matrix_with_cond, mgs
from kernelnotes.linalg.regression import (
    U64,
    design_matrix,
    digits_lost,
    fit_qr,
    line_data,
    plane_data,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

CONDS_ORTH = np.logspace(0, 10, 21)
CONDS_LSTSQ = np.logspace(0, 12, 25)
PENDING = '!!! info "Results pending"\n    Run `python -m benchmarks linalg` on a GPU.'


# --8<-- [start:orthogonality]
def orthogonality_loss(conds: Iterable[float], m: int = 60, n: int = 12,
                       seed: int = 0) -> dict[str, np.ndarray]:
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


def figure_orthogonality() -> Figure:
    import matplotlib.pyplot as plt

    loss = orthogonality_loss(CONDS_ORTH)
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for (name, v), marker in zip(loss.items(), "osd", strict=True):
        ax.loglog(CONDS_ORTH, v, marker=marker, ms=4, label=name)
    ax.loglog(CONDS_ORTH, U64 * CONDS_ORTH, "k:", lw=0.8, label=r"$u\,\kappa$")
    ax.loglog(CONDS_ORTH, np.minimum(U64 * CONDS_ORTH**2, 1), "k--", lw=0.8, label=r"$u\,\kappa^2$")
    ax.set_xlabel(r"condition number $\kappa_2(A)$ (A is 60 x 12)")
    ax.set_ylabel(r"$\|Q^T Q - I\|_2$")
    ax.set_title("Loss of orthogonality in float64: CGS ~ u κ², MGS ~ u κ, Householder ~ u",
                 fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, which="major", alpha=0.3)
    return fig


def figure_digits_lost() -> Figure:
    import matplotlib.pyplot as plt

    lost = digits_lost(CONDS_LSTSQ)
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for (name, v), marker in zip(lost.items(), "os", strict=True):
        ax.semilogx(CONDS_LSTSQ, v, marker=marker, ms=4, label=name)
    ax.semilogx(CONDS_LSTSQ, np.log10(CONDS_LSTSQ), "k:", lw=0.8, label=r"$\log_{10}\kappa$")
    ax.semilogx(CONDS_LSTSQ, np.minimum(2 * np.log10(CONDS_LSTSQ), -np.log10(U64)), "k--", lw=0.8,
                label=r"$2\log_{10}\kappa$ (capped at all 16 digits)")
    ax.set_xlabel(r"condition number $\kappa_2(A)$ (A is 100 x 10)")
    ax.set_ylabel(r"digits lost, $\log_{10}(\mathrm{rel.\ error} / u)$")
    ax.set_title("Least squares in float64: the normal equations lose twice the digits", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, which="major", alpha=0.3)
    return fig


def figure_regression_line() -> Figure:
    import matplotlib.pyplot as plt

    x, y = line_data()
    m, b = fit_qr(design_matrix(x), y)
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.scatter(x, y, s=14, label="data $(x_i, y_i)$")
    xs = np.array([0.0, 10.0])
    ax.plot(xs, m * xs + b, color="tab:red", label=f"best fit $\\hat y = {m:.3f}\\,x + {b:.3f}$")
    for xi, yi in zip(x, y, strict=True):
        ax.plot([xi, xi], [yi, m * xi + b], color="grey", lw=0.6)
    ax.set_xlabel("$x$")
    ax.set_ylabel("$y$")
    ax.set_title("Least squares: the grey residuals have the smallest sum of squares", fontsize=9)
    ax.legend(fontsize=8)
    return fig


def figure_regression_plane() -> Figure:
    import matplotlib.pyplot as plt

    X, z = plane_data()
    w1, w2, b = fit_qr(design_matrix(X), z)
    fig = plt.figure(figsize=(6.4, 4.8))
    ax = fig.add_subplot(projection="3d")
    ax.scatter(X[:, 0], X[:, 1], z, s=10, color="tab:blue")
    g = np.linspace(0, 10, 11)
    G1, G2 = np.meshgrid(g, g)
    ax.plot_surface(G1, G2, w1 * G1 + w2 * G2 + b, alpha=0.35, color="tab:red")
    ax.set_xlabel("$x_1$")
    ax.set_ylabel("$x_2$")
    ax.set_zlabel("$y$")
    ax.set_title(f"best-fit plane $\\hat y = {w1:.2f}\\,x_1 {w2:+.2f}\\,x_2 {b:+.2f}$", fontsize=9)
    ax.view_init(elev=18, azim=-60)
    return fig


def speedups(rows: list[dict], ops: tuple[str, ...]) -> list[dict]:
    """Pair each Triton row with the torch.linalg row of the same op and size."""
    keys = ("op", "batch", "m", "n", "k")
    torch_ms = {tuple(r[f] for f in keys): r["ms"] for r in rows if r["impl"] == "torch"}
    out = []
    for r in rows:
        key = tuple(r[f] for f in keys)
        if r["impl"] == "triton" and r["op"] in ops and key in torch_ms:
            out.append({**r, "torch_ms": torch_ms[key], "speedup": torch_ms[key] / r["ms"]})
    return out


def _bench_table(ops: tuple[str, ...]) -> str:
    try:
        res = load("linalg")
    except FileNotFoundError:
        return PENDING
    meta = res["meta"]
    body = []
    for q in speedups(res["rows"], ops):
        size = f"{q['batch']} x {q['m']} x {q['n']}" + (f", k = {q['k']}" if q["k"] else "")
        target = f"{q['target']:g}x" if q.get("target") else "-"
        body.append([q["op"], size, f"{q['ms']:.3f}", f"{q['torch_ms']:.3f}",
                     f"{q['speedup']:.1f}x", target, f"{q['gbs']:.0f}",
                     f"{100 * q['gbs'] / meta['copy_gbs']:.0f} %"])
    table = markdown_table(["op", "batch x m x n", "Triton ms", "torch.linalg ms", "speed-up",
                            "target", "Triton GB/s", "of copy roofline"], body)
    return (table + "\n\n" + provenance(meta)
            + f" Copy ceiling in that run: {meta['copy_gbs']:.0f} GB/s (bytes read + written).")


def table_bench_lu_qr() -> str:
    return _bench_table(("lu_factor", "lu_solve", "qr"))


def table_bench_lstsq() -> str:
    return _bench_table(("lstsq",))


def table_growth() -> str:
    """Growth factor of partial pivoting on Wilkinson's matrix, and what it does to a solve."""
    from kernelnotes.linalg.reference import (
        growth_factor,
        lstsq_qr,
        lu_factor,
        lu_solve,
        wilkinson_growth_matrix,
    )

    rows = []
    for n in (10, 20, 30, 40, 50, 60):
        A = wilkinson_growth_matrix(n)
        LU, piv = lu_factor(A)
        x_true = np.random.default_rng(0).standard_normal(n)
        b = A @ x_true
        err_lu = np.linalg.norm(lu_solve(LU, piv, b) - x_true) / np.linalg.norm(x_true)
        err_qr = np.linalg.norm(lstsq_qr(A, b) - x_true) / np.linalg.norm(x_true)
        rows.append([n, f"$2^{{{n - 1}}}$ = {growth_factor(A, LU):.3g}", f"{np.linalg.cond(A):.1f}",
                     f"{err_lu:.1e}", f"{err_qr:.1e}"])
    return markdown_table(["$n$", r"growth $\rho$", r"$\kappa_2(A)$", "LU solve rel. error",
                           "QR solve rel. error"], rows)
