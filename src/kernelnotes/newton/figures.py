"""Tables and figures of the Newton post, computed at build time (hooks/computed.py).

matplotlib and the benchmark results are read inside the functions, so importing this module
costs nothing.
"""

from __future__ import annotations

import math

import numpy as np

from kernelnotes._results import load, markdown_table, provenance
from kernelnotes.newton.reference import bisection, convergence_order, halley, newton

ROOT2 = math.sqrt(2.0)


def sqrt2_runs() -> dict[str, np.ndarray]:
    """Iterates of the three solvers on f(x) = x^2 - 2 (Newton and Halley from 2, bisection on
    [1, 2])."""
    f, df, d2f = (lambda x: x * x - 2.0), (lambda x: 2.0 * x), (lambda x: 2.0)
    return {
        "Newton": newton(f, df, 2.0),
        "Halley": halley(f, df, d2f, 2.0),
        "Bisection": bisection(f, 1.0, 2.0),
    }


def _sci(v: float) -> str:
    return "0" if v == 0 else f"{v:.2e}"


def table_sqrt2_newton() -> str:
    runs = sqrt2_runs()
    x = runs["Newton"]
    e = np.abs(x - ROOT2)
    ratio = ["-"] + [
        f"{e[n + 1] / e[n] ** 2:.4f}" if e[n + 1] > 1e-14 else "-" for n in range(len(e) - 1)
    ]
    rows = [[n, f"{x[n]:.16f}", _sci(e[n]), ratio[n]] for n in range(len(x))]
    return markdown_table(
        ["$n$", "$x_n$", "$\\lvert x_n - \\sqrt 2 \\rvert$", "$e_n / e_{n-1}^2$"], rows
    )


def table_sqrt2_compare() -> str:
    runs = sqrt2_runs()
    n_rows = 6
    cols = {k: np.abs(v - ROOT2) for k, v in runs.items()}
    rows = [[n] + [_sci(c[n]) if n < len(c) else "" for c in cols.values()] for n in range(n_rows)]
    return markdown_table(["step $n$"] + [f"{k} error" for k in cols], rows)


def figure_sqrt2_errors():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for (name, x), marker in zip(sqrt2_runs().items(), "osd", strict=True):
        e = np.abs(x - ROOT2)
        n = np.arange(len(e))
        keep = e > 0  # a log axis cannot show an exact hit
        ax.semilogy(n[keep], e[keep], marker=marker, ms=4, label=name)
    ax.axhline(
        2.0**-52 * ROOT2, color="grey", lw=0.8, ls="--", label="ulp of $\\sqrt{2}$ (float64)"
    )
    ax.set_xlabel("iteration $n$")
    ax.set_ylabel("$|x_n - \\sqrt{2}|$")
    ax.set_title(
        "Solving $x^2 - 2 = 0$: digits double (Newton), triple (Halley), "
        "one bit a step (bisection)",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    ax.grid(True, which="major", alpha=0.3)
    return fig


def figure_failure_modes():
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.4))
    # the cycle of f(x) = x^3 - 2x + 2 from x0 = 0: the tangents bounce between 0 and 1
    g = lambda x: x**3 - 2 * x + 2  # noqa: E731
    xs = np.linspace(-2.2, 1.8, 400)
    ax = axes[0]
    ax.plot(xs, g(xs), lw=1.5)
    ax.axhline(0, color="k", lw=0.6)
    for a, b in [(0.0, 1.0), (1.0, 0.0)]:
        ax.plot([a, a, b], [0, g(a), 0], color="tab:red", lw=1)
    ax.set_title("$x^3 - 2x + 2$ from $x_0 = 0$: a 2-cycle", fontsize=9)
    # linear convergence at roots of multiplicity m: the error ratio settles at 1 - 1/m
    ax = axes[1]
    for m in (1, 2, 3):
        h = newton(
            lambda x, m=m: (x - 1.0) ** m * (x + 2.0),
            lambda x, m=m: m * (x - 1.0) ** (m - 1) * (x + 2.0) + (x - 1.0) ** m,
            2.0,
            tol=1e-13,
            max_iter=500,
        )
        e = np.abs(h - 1.0)
        e = e[e > 1e-12]
        ax.semilogy(np.arange(len(e)), e, marker="o", ms=3, label=f"multiplicity {m}")
    ax.set_xlabel("iteration $n$")
    ax.set_ylabel("$|x_n - 1|$")
    ax.set_title("$(x-1)^m (x+2)$ from $x_0 = 2$", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def table_orders() -> str:
    rows = []
    for name, x in sqrt2_runs().items():
        if name == "Bisection":  # its error is not monotone: an order is meaningless there
            continue
        e = np.abs(x - ROOT2)
        e = e[e > 1e-14]  # below that float64 rounding, not the method, sets the error
        q = convergence_order(e)
        rows.append([name, ", ".join(f"{v:.3f}" for v in q[-3:])])
    return markdown_table(["method", "last empirical orders $q_n$"], rows)


def table_bench() -> str:
    """Both kernels against torch.sqrt / torch.rsqrt in the committed run: times (medians),
    bandwidths, and the share of torch's rate and of the copy rate that the kernels reach."""
    try:
        res = load("newton")
    except FileNotFoundError:
        return '!!! info "Results pending"\n    Run `python -m benchmarks newton` on a GPU.'
    copy = res["meta"]["copy_gbs"]
    via_op = all("op_ms" in r for r in res["rows"])  # timed through the dispatcher too
    rows = []
    for r in res["rows"]:
        rows.append(
            [
                r["op"],
                r["dtype"],
                f"2^{int(math.log2(r['n']))}",
                f"{1e3 * r['ms']:.1f}",
                *([f"{1e3 * r['op_ms']:.1f}"] if via_op else []),
                f"{1e3 * r['torch_ms']:.1f}",
                f"{r['gbs']:.0f}",
                f"{r['torch_gbs']:.0f}",
                f"{100 * r['gbs'] / r['torch_gbs']:.1f}%",
                f"{100 * r['gbs'] / copy:.1f}%",
            ]
        )
    table = markdown_table(
        [
            "op",
            "dtype",
            "n",
            "Triton µs",
            *(["operator µs"] if via_op else []),
            "torch µs",
            "Triton GB/s",
            "torch GB/s",
            "of torch's rate",
            "of the copy rate",
        ],
        rows,
    )
    return (
        table
        + "\n\n"
        + provenance(res["meta"])
        + f" Copy rate in that run: {copy:.0f} GB/s."
    )
