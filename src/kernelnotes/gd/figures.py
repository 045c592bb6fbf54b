"""Tables and figures of the gradient-descent post, computed at build time (hooks/computed.py).

matplotlib and the benchmark results are read inside the functions, so importing this module
costs nothing. The studies themselves (``lr_study``, ``regression_data``, ``cost_study``,
``sgd_runs``, ``optimizer_runs``) are plain functions the post's check fences call too.
"""

from __future__ import annotations

import math

import numpy as np

from kernelnotes._results import load, markdown_table, provenance
from kernelnotes.gd.reference import (
    adam,
    gd,
    lstsq_grad,
    lstsq_loss,
    minibatch_sgd,
    momentum,
    regime,
    step_decay,
    steps_to_tol,
    warmup_cosine,
)

X0 = 1.8  # the starting point on f(x) = x^2
EXAMPLE_RATES = (0.01, 0.1, 1.6)  # a "too small", a "good" and a "too large" rate
STUDY_RATES = (0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.6)
TOLS = (1e-2, 1e-6)
THETA0_2D = (-4.0, 2.0)  # start on the paraboloid theta1^2 + 2 theta2^2
RATES_2D = (0.1, 0.3)


# ---------------------------------------------------------------- studies


def x_squared_path(alpha: float, n_steps: int) -> np.ndarray:
    """x_0 .. x_n of GD on f(x) = x^2 from 1.8."""
    return gd(lambda x: 2 * x, X0, alpha, n_steps)[:, 0]


def paraboloid_grad(t: np.ndarray) -> np.ndarray:
    return np.array([2 * t[0], 4 * t[1]])  # grad of theta1^2 + 2 theta2^2


def regression_data(n: int = 2000, d: int = 50, seed: int = 0, spread: float = 10.0):
    """X [n, d] with column scales from 1 to ``spread`` (10: condition number of X^T X near
    100), y = X w + noise of standard deviation 0.1."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * np.linspace(1.0, spread, d)  # [n, d]
    w = rng.normal(size=d)
    y = X @ w + 0.1 * rng.normal(size=n)  # [n]
    return X, y


def cost_study(tol: float = 1e-8) -> dict:
    """Normal equations, QR and GD (rate 1/L) on regression_data(): flops and accuracy."""
    X, y = regression_data()
    n, d = X.shape
    exact = np.linalg.lstsq(X, y, rcond=None)[0]
    theta_ne = np.linalg.solve(X.T @ X, X.T @ y)
    Q, R = np.linalg.qr(X)
    theta_qr = np.linalg.solve(R, Q.T @ y)
    H = 2 / n * X.T @ X  # Hessian of the mean squared error
    eig = np.linalg.eigvalsh(H)
    L, mu = eig[-1], eig[0]
    theta, k = np.zeros(d), 0
    while np.linalg.norm(theta - exact) > tol * np.linalg.norm(exact):
        theta = theta - lstsq_grad(X, y, theta) / L
        k += 1
    return {
        "n": n, "d": d, "kappa": L / mu, "gd_steps": k,
        # X^T X (symmetric half), Cholesky, X^T y | Householder R, then Q^T y | 2 mat-vecs a step
        "flops": {"normal equations": n * d * d + d**3 / 3 + 2 * n * d,
                  "QR (Householder)": 2 * n * d * d - 2 * d**3 / 3 + 4 * n * d,
                  "gradient descent": k * 4 * n * d},
        "err": {"normal equations": np.linalg.norm(theta_ne - exact) / np.linalg.norm(exact),
                "QR (Householder)": np.linalg.norm(theta_qr - exact) / np.linalg.norm(exact),
                "gradient descent": np.linalg.norm(theta - exact) / np.linalg.norm(exact)},
    }


def sgd_runs(n_epochs: int = 5, seed: int = 1) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(epochs seen, loss) after every step of batch GD, mini-batch (32) and SGD (1), same rate."""
    X, y = regression_data(n=1000, d=10, seed=seed, spread=1.0)  # one rate suits all three
    alpha = 0.01
    out = {}
    for name, batch in (("batch GD", len(y)), ("mini-batch, b = 32", 32), ("SGD, b = 1", 1)):
        rng = np.random.default_rng(seed)
        path = minibatch_sgd(X, y, np.zeros(10), alpha, batch, n_epochs, rng)
        epochs = np.arange(len(path)) * batch / len(y)
        out[name] = (np.minimum(epochs, n_epochs), np.array([lstsq_loss(X, y, t) for t in path]))
    return out


def optimizer_runs(n_steps: int = 150) -> dict[str, np.ndarray]:
    """GD, momentum and Adam on f = theta1^2 + 25 theta2^2 from (-4, 2): f after each step."""
    grad = lambda t: np.array([2 * t[0], 50 * t[1]])  # noqa: E731
    f = lambda P: P[:, 0] ** 2 + 25 * P[:, 1] ** 2  # noqa: E731
    start = np.array(THETA0_2D)
    return {
        "GD, alpha = 0.035": f(gd(grad, start, 0.035, n_steps)),
        "momentum, alpha = 0.035, beta = 0.5": f(momentum(grad, start, 0.035, 0.5, n_steps)),
        "Adam, lr = 0.3": f(adam(grad, start, n_steps, lr=0.3)),
    }


def regression_optimizer_runs(n_steps: int = 300) -> dict[str, np.ndarray]:
    """Excess loss L(theta_k) - L* of GD, momentum and Adam on regression_data(), from 0.

    GD takes alpha = 1/L (L: the largest Hessian eigenvalue); the heavy ball its optimal pair for
    a quadratic with Hessian eigenvalues in [mu, L]: alpha = 4 / (sqrt L + sqrt mu)^2,
    beta = ((sqrt k - 1)/(sqrt k + 1))^2.
    """
    X, y = regression_data()
    n, d = X.shape
    eig = np.linalg.eigvalsh(2 / n * X.T @ X)
    L, mu = eig[-1], eig[0]
    best = lstsq_loss(X, y, np.linalg.lstsq(X, y, rcond=None)[0])
    grad = lambda t: lstsq_grad(X, y, t)  # noqa: E731
    sk = math.sqrt(L / mu)
    paths = {
        "GD, alpha = 1/lambda_max": gd(grad, np.zeros(d), 1 / L, n_steps),
        "momentum, optimal alpha and beta": momentum(grad, np.zeros(d),
                                                     4 / (math.sqrt(L) + math.sqrt(mu)) ** 2,
                                                     ((sk - 1) / (sk + 1)) ** 2, n_steps),
        "Adam, lr = 0.1": adam(grad, np.zeros(d), n_steps, lr=0.1),
    }
    return {name: np.array([lstsq_loss(X, y, t) for t in P]) - best for name, P in paths.items()}


# ---------------------------------------------------------------- tables


def _num(v: float) -> str:
    if v == 0:
        return "0"
    return f"{v:.4g}" if 1e-3 <= abs(v) < 1e4 else f"{v:.2e}"


def table_lr_study() -> str:
    rows = []
    for a in STUDY_RATES:
        x = x_squared_path(a, 10)
        steps = [steps_to_tol(X0, a, tol) for tol in TOLS]
        rows.append([a, _num(1 - 2 * a), regime(a), _num(x[1]), _num(x[5]), _num(x[10])]
                    + ["never" if s == math.inf else s for s in steps])
    head = ["$\\alpha$", "$1 - 2\\alpha$", "regime", "$x_1$", "$x_5$", "$x_{10}$"]
    head += [f"steps to $\\lvert x_k\\rvert \\le 10^{{{int(math.log10(t))}}}$" for t in TOLS]
    return markdown_table(head, rows, align="rrlrrrrr")


def table_costs() -> str:
    s = cost_study()
    rows = [[name, f"{s['flops'][name]:.3g}", f"{s['err'][name]:.1e}"] for name in s["flops"]]
    return (markdown_table(["method", "flops", "relative error vs `np.linalg.lstsq`"], rows)
            + f"\n\n$n = {s['n']}$, $d = {s['d']}$, condition number of $X^\\mathsf{{T}} X$: "
            f"{s['kappa']:.0f}; gradient descent with $\\alpha = 1/\\lambda_{{\\max}}$ took "
            f"{s['gd_steps']} steps.")


def table_bench() -> str:
    try:
        res = load("gd")
    except FileNotFoundError:
        return '!!! info "Results pending"\n    Run `python -m benchmarks gd` on a GPU.'
    copy = res["meta"]["copy_gbs"]
    rows = []
    for r in res["rows"]:
        if r["impl"] == "kernelnotes (fixed config)":
            continue
        fused = next((q for q in res["rows"] if q["case"] == r["case"] and q["dtype"] == r["dtype"]
                      and q["impl"] == "torch fused=True"), None)
        ratio = f"{fused['ms_p50'] / r['ms_p50']:.2f}" if fused else "-"
        rows.append([r["case"], r["dtype"], r["impl"], f"{r['n_tensors']}", f"{r['n_params']:.3g}",
                     r["bytes_per_param"], f"{r['ms_p50']:.3f}", f"{r['gbs']:.0f}",
                     f"{r['gbs'] / copy:.1%}", ratio])
    table = markdown_table(["case", "param dtype", "implementation", "tensors", "elements",
                            "B/elem", "ms", "GB/s", "of copy", "torch fused time / this"], rows,
                           align="lllrrrrrrr")
    return (table + "\n\n" + provenance(res["meta"])
            + f" Copy ceiling in that run: {copy:.0f} GB/s.")


def table_bench_configs() -> str:
    try:
        res = load("gd")
    except FileNotFoundError:
        return '!!! info "Results pending"\n    Run `python -m benchmarks gd` on a GPU.'
    copy = res["meta"]["copy_gbs"]
    rows = [[r["case"], r["config"], f"{r['ms_p50']:.3f}", f"{r['gbs'] / copy:.1%}"]
            for r in res["rows"] if r["impl"] == "kernelnotes (fixed config)"]
    if not rows:
        return ('!!! info "Results pending"\n'
                "    The config sweep runs in the full (not quick) benchmark.")
    return markdown_table(["case", "config", "ms", "of copy"], rows)


# ---------------------------------------------------------------- figures


def figure_lr_paths():
    import matplotlib.pyplot as plt

    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9.6, 3.6))
    xs = np.linspace(-2.2, 2.2, 200)
    ax0.plot(xs, xs**2, color="grey", lw=1)
    for a, c in zip((0.1, 0.75), ("C0", "C1"), strict=True):
        x = x_squared_path(a, 6)
        ax0.plot(x, x**2, "-o", ms=4, color=c, lw=0.8, label=f"$\\alpha$ = {a}")
    ax0.set_xlim(-2.2, 2.2)
    ax0.set_ylim(-0.2, 4.8)
    ax0.set_xlabel("$x$")
    ax0.set_ylabel("$f(x) = x^2$")
    ax0.set_title("monotone ($\\alpha$ < 1/2) and oscillating ($1/2 < \\alpha$ < 1)", fontsize=9)
    ax0.legend(fontsize=8)
    k = np.arange(31)
    for a, m in zip(EXAMPLE_RATES + (0.75,), "osd^", strict=True):
        ax1.semilogy(k, np.abs(x_squared_path(a, 30)), marker=m, ms=3, label=f"$\\alpha$ = {a}")
    ax1.set_xlabel("step $k$")
    ax1.set_ylabel("$|x_k|$")
    ax1.set_title("$|x_k| = |1 - 2\\alpha|^k \\cdot 1.8$", fontsize=9)
    ax1.legend(fontsize=8)
    ax1.grid(True, alpha=0.3)
    return fig


def _paraboloid_grid():
    t1, t2 = np.meshgrid(np.linspace(-4.5, 4.5, 121), np.linspace(-2.5, 2.5, 81))
    return t1, t2, t1**2 + 2 * t2**2


def figure_contour():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    t1, t2, f = _paraboloid_grid()
    ax.contour(t1, t2, f, levels=np.linspace(0.5, 24, 12), colors="grey", linewidths=0.6)
    for a, c in zip(RATES_2D, ("C0", "C1"), strict=True):
        p = gd(paraboloid_grad, THETA0_2D, a, 15)
        ax.plot(p[:, 0], p[:, 1], "-o", ms=3, color=c, lw=1, label=f"$\\alpha$ = {a}")
    ax.plot(0, 0, "k*", ms=8)
    ax.set_aspect("equal")
    ax.set_xlabel("$\\theta_1$")
    ax.set_ylabel("$\\theta_2$")
    ax.set_title("$f = \\theta_1^2 + 2\\theta_2^2$: zig-zag in $\\theta_2$ exactly when "
                 "$\\alpha > 1/4$", fontsize=9)
    ax.legend(fontsize=8)
    return fig


def figure_surface():
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(6.4, 4.4))
    ax = fig.add_subplot(projection="3d")
    t1, t2, f = _paraboloid_grid()
    ax.plot_surface(t1, t2, f, cmap="viridis", alpha=0.55, linewidth=0, rstride=4, cstride=4)
    p = gd(paraboloid_grad, THETA0_2D, RATES_2D[0], 25)
    ax.plot(p[:, 0], p[:, 1], p[:, 0] ** 2 + 2 * p[:, 1] ** 2 + 0.2, "-o", color="C3", ms=3, lw=1.2)
    ax.set_xlabel("$\\theta_1$")
    ax.set_ylabel("$\\theta_2$")
    ax.set_zlabel("$f$")
    ax.view_init(elev=35, azim=-60)
    ax.set_title(f"GD from {THETA0_2D}, $\\alpha$ = {RATES_2D[0]}", fontsize=9)
    return fig


def figure_sgd_curves():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for name, (ep, loss) in sgd_runs().items():
        ax.semilogy(ep, loss, lw=0.9, label=name)
    ax.set_xlabel("epochs (passes over the data)")
    ax.set_ylabel("mean squared error")
    ax.set_title("same rate $\\alpha$ = 0.01: more, noisier steps per pass", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    return fig


def figure_optimizers():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for name, f in optimizer_runs().items():
        ax.semilogy(np.arange(len(f)), np.maximum(f, 1e-300), lw=1, label=name)
    ax.set_ylim(1e-12, 1e3)
    ax.set_xlabel("step $k$")
    ax.set_ylabel("$f(\\theta_k)$")
    ax.set_title("$f = \\theta_1^2 + 25\\theta_2^2$ from $(-4, 2)$", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    return fig


def figure_regression_optimizers():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for name, f in regression_optimizer_runs().items():
        ax.semilogy(np.arange(len(f)), np.maximum(f, 1e-16), lw=1, label=name)
    ax.set_ylim(1e-14, 1e4)
    ax.set_xlabel("step $k$")
    ax.set_ylabel("$L(\\theta_k) - L^\\star$")
    X, _ = regression_data()
    kappa = np.linalg.cond(X.T @ X)
    ax.set_title(f"least squares, $n$ = {X.shape[0]}, $d$ = {X.shape[1]}, "
                 f"condition number {kappa:.0f}", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    return fig


def figure_schedules():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.0))
    k = np.arange(1000)
    ax.plot(k, [step_decay(i, 0.1, 0.5, 250) for i in k],
            label="step decay ($\\gamma$ = 0.5 every 250)")
    ax.plot(k, [warmup_cosine(i, 0.1, 100, 1000, 0.001) for i in k],
            label="linear warmup (100) + cosine to 0.001")
    ax.set_xlabel("step $k$")
    ax.set_ylabel("learning rate $\\alpha_k$")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    return fig
