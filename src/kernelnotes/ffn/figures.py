"""Figures and tables of the feed-forward and backprop posts, computed at build time.

``figure_<name>()`` returns a matplotlib Figure; ``table_<name>()`` returns markdown. The
performance table reads ``benchmarks/results/ffn.json`` and says so when it is not there yet.
"""

from __future__ import annotations

import numpy as np

from kernelnotes import _results
from kernelnotes.ffn import reference as ref

SMOOTH = ("gelu", "gelu_tanh", "silu", "sigmoid", "tanh")
UA_WIDTHS = (2, 4, 8, 16, 32, 64, 128, 256)
SUSTAINED = "sustained 3 s (power)"  # benchmarks/bench_ffn.py: rows timed at the power cap
TRAINING = "training layers (interleaved)"  # the block's forward and dZ1 layers, both ways
ENERGY = "energy at the cap, by activation"  # each activation sustained 3 s, with its SASS count
LINEAR_ACT = "triton linear_act "  # the energy rows of linear_act, "<LINEAR_ACT><activation>"
CUBLAS = "torch F.linear (cuBLAS, bias fused)"  # the peer every forward table compares with


def ua_target(x):
    """The function the universal-approximation figure fits."""
    return np.sin(2 * np.pi * x) + 0.5 * np.cos(5 * np.pi * x)


def ua_errors(widths=UA_WIDTHS, n_test=4001):
    """Max error on [0, 1] of the width-h ReLU fit, for each h."""
    x = np.linspace(0.0, 1.0, n_test)[:, None]
    out = []
    for h in widths:
        y = ref.ffn_forward(x, ref.relu_fit(ua_target, h), "relu")[0][:, 0]
        out.append(float(np.max(np.abs(y - ua_target(x[:, 0])))))
    return np.array(out)


def activation_extrema(name, lo=-8.0, hi=8.0, n=160001):
    """(argmax, max, argmin, min) of sigma' on a fine grid of [lo, hi]."""
    z = np.linspace(lo, hi, n)
    d = ref.activation_grad(z, name)
    return float(z[np.argmax(d)]), float(d.max()), float(z[np.argmin(d)]), float(d.min())


def figure_activations():
    import matplotlib.pyplot as plt

    z = np.linspace(-4, 4, 801)
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9, 3.6), constrained_layout=True)
    for name in ("relu", "gelu", "silu", "sigmoid", "tanh"):
        ax0.plot(z, ref.activation(z, name), label=name)
        ax1.plot(z, ref.activation_grad(z, name), label=name)
    ax0.set_title(r"$\sigma(z)$")
    ax1.set_title(r"$\sigma'(z)$")
    for ax in (ax0, ax1):
        ax.axhline(0, color="0.6", lw=0.6)
        ax.axvline(0, color="0.6", lw=0.6)
        ax.set_xlabel("z")
    ax0.set_ylim(-1.2, 4.2)
    ax1.set_ylim(-0.2, 1.2)
    ax1.legend(loc="upper left", fontsize=8)
    return fig


def figure_universal():
    import matplotlib.pyplot as plt

    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9, 3.6), constrained_layout=True)
    x = np.linspace(0, 1, 1001)[:, None]
    ax0.plot(x[:, 0], ua_target(x[:, 0]), color="k", lw=2, label="f(x)")
    for h in (4, 8, 32):
        y = ref.ffn_forward(x, ref.relu_fit(ua_target, h), "relu")[0][:, 0]
        ax0.plot(x[:, 0], y, lw=1, label=f"h = {h}")
    ax0.set_xlabel("x")
    ax0.legend(fontsize=8)
    ax0.set_title("one hidden ReLU layer of width h")
    hs = np.array(UA_WIDTHS)
    errs = ua_errors()
    ax1.loglog(hs, errs, "o-", label="max error")
    ax1.loglog(hs, errs[2] * (hs / hs[2]) ** -2.0, "--", color="0.5", label=r"$\propto h^{-2}$")
    ax1.set_xlabel("hidden width h")
    ax1.legend(fontsize=8)
    ax1.set_title(r"$\max_x |f(x) - \hat f_h(x)|$")
    return fig


def figure_xor():
    import matplotlib.pyplot as plt

    layers, losses = ref.train(
        ref.XOR_X, ref.XOR_Y, [2, 4, 1], act="tanh", lr=0.5, steps=2000, seed=0
    )
    g = np.linspace(-0.25, 1.25, 151)
    G = np.array(np.meshgrid(g, g)).reshape(2, -1).T
    out = ref.ffn_forward(G, layers, "tanh")[0].reshape(len(g), len(g))
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9, 3.6), constrained_layout=True)
    ax0.semilogy(losses)
    ax0.set_xlabel("gradient-descent step")
    ax0.set_title("training loss, XOR, widths 2-4-1, tanh")
    cs = ax1.contourf(g, g, out, levels=np.linspace(-0.5, 1.5, 21), cmap="coolwarm")
    ax1.contour(g, g, out, levels=[0.5], colors="k")
    ax1.scatter(
        ref.XOR_X[:, 0], ref.XOR_X[:, 1], c=ref.XOR_Y[:, 0], cmap="coolwarm", edgecolors="k", s=80
    )
    ax1.set_title(r"$\hat y(x)$ and the level set $\hat y = 0.5$")
    fig.colorbar(cs, ax=ax1)
    return fig


def table_activations():
    rows = []
    formulas = {
        "relu": r"$\max(z, 0)$",
        "gelu": r"$z\,\Phi(z)$",
        "gelu_tanh": r"$\tfrac{z}{2}\big(1 + \tanh(\sqrt{2/\pi}\,(z + 0.044715 z^3))\big)$",
        "silu": r"$z\,s(z)$, $s(z) = 1/(1 + e^{-z})$",
        "sigmoid": r"$s(z)$",
        "tanh": r"$\tanh z$",
    }
    for name, formula in formulas.items():
        zmax, dmax, zmin, dmin = activation_extrema(name)
        d0 = float(ref.activation_grad(np.array([0.0]), name)[0])
        big = f"{dmax:.4f} at z = {zmax:.3f}"
        small = f"{dmin:.4f} at z = {zmin:.3f}"
        if abs(abs(zmin) - 8.0) < 1e-9:  # the grid's end: a limit, not an attained value
            small = r"$\to 0$ as $\lvert z \rvert \to \infty$"
        if name == "relu":
            big, small = "1 for z > 0", "0 for z <= 0"
        rows.append([f"`{name}`", formula, f"{d0:.4g}", big, small])
    return _results.markdown_table(
        ["name", r"$\sigma(z)$", r"$\sigma'(0)$", r"largest $\sigma'$", r"smallest $\sigma'$"],
        rows,
        "llrll",
    )


def worked_intermediates():
    """Every value of the worked example's forward and backward pass, by name."""
    X, Y, layers = ref.worked_example()
    y_hat, cache = ref.ffn_forward(X, layers, "relu")
    loss, dY = ref.mse_loss(y_hat, Y)
    (
        (dW1, db1),
        (dW2, db2),
    ) = ref.ffn_backward(dY, layers, cache, "relu")[0]
    (W2, _) = layers[1]
    z1, a1 = cache[1][1][0], cache[1][0][0]
    da1 = (dY @ W2)[0]
    return {
        "z_1": z1,
        "a_1": a1,
        "z_2": cache[2][1][0],
        "L": np.array([loss]),
        "dL/dz_2": dY[0],
        "dL/dW_2": dW2[0],
        "dL/db_2": db2,
        "dL/da_1": da1,
        "sigma'(z_1)": ref.activation_grad(z1, "relu"),
        "dL/dz_1": da1 * ref.activation_grad(z1, "relu"),
        "dL/dW_1 (rows)": dW1,
        "dL/db_1": db1,
    }


def table_worked_example():
    symbols = {
        "z_1": r"$z_1 = W_1 x + b_1$",
        "a_1": r"$a_1 = \mathrm{relu}(z_1)$",
        "z_2": r"$\hat y = z_2 = W_2 a_1 + b_2$",
        "L": r"$L = \frac12 (\hat y - y)^2$",
        "dL/dz_2": r"$\partial L/\partial z_2 = \hat y - y$",
        "dL/dW_2": r"$\partial L/\partial W_2 = \frac{\partial L}{\partial z_2} a_1^\top$",
        "dL/db_2": r"$\partial L/\partial b_2$",
        "dL/da_1": r"$\partial L/\partial a_1 = W_2^\top \frac{\partial L}{\partial z_2}$",
        "sigma'(z_1)": r"$\sigma'(z_1)$",
        "dL/dz_1": (
            r"$\partial L/\partial z_1 = \frac{\partial L}{\partial a_1} \odot \sigma'(z_1)$"
        ),
        "dL/dW_1 (rows)": r"$\partial L/\partial W_1 = \frac{\partial L}{\partial z_1} x^\top$",
        "dL/db_1": r"$\partial L/\partial b_1 = \frac{\partial L}{\partial z_1}$",
    }
    rows = []
    for key, val in worked_intermediates().items():
        val = np.atleast_2d(val)
        text = "; ".join("[" + ", ".join(f"{v + 0.0:.6g}" for v in row) + "]" for row in val)
        rows.append([symbols[key], text])
    return _results.markdown_table(["quantity", "value"], rows, "ll")


def _ms(rows, op, impl):
    for r in rows:
        if r["op"] == op and r["impl"] == impl and "ms" in r:
            return r["ms"]
    return None


def ratios(rows: list[dict]) -> list[tuple[str, float | None, float]]:
    """(what, speed-up = peer ms / our ms, target) for each target of issue 7; the default
    paths first, then the fixed TMA configs against the same targets."""
    out = []
    fwd_peers = (
        (CUBLAS, 1.0),
        ("torch eager F.gelu(F.linear)", 1.1),
    )
    ffn_peers = (("torch eager autograd", 1.0), ("torch.compile", 0.9))
    cases = [
        ("forward", "triton linear_act gelu", fwd_peers),
        ("ffn fwd+bwd", "triton FFNFunction (gelu)", ffn_peers),
        ("forward", "triton linear_act gelu [TMA]", fwd_peers),
        ("forward", "triton linear_act gelu [TMA, FLATTEN]", fwd_peers),
    ]
    for op, ours, peers in cases:
        if not any(r["op"] == op and r["impl"] == ours for r in rows):
            continue  # not in this results file
        mine = _ms(rows, op, ours)
        for peer, target in peers:
            theirs = _ms(rows, op, peer)
            ratio = theirs / mine if mine and theirs else None
            out.append((f"{ours} vs {peer}", ratio, target))
    return out


def _note(row) -> str:
    """A row without timings: its error or why it was skipped, fit for one table cell."""
    note = str(row.get("error") or row.get("skipped", ""))
    return note.replace("|", "/").replace("\n", " ")[:80]


def table_performance():
    try:
        data = _results.load("ffn")
    except FileNotFoundError:
        return (
            '!!! note "Results pending"\n'
            "    Results pending: run `python -m benchmarks ffn` on a GPU; "
            "the table and the ratios against the targets appear here from "
            "`benchmarks/results/ffn.json`."
        )
    rows = []
    for r in data["rows"]:
        if r["op"] in (SUSTAINED, TRAINING, ENERGY):
            continue  # table_power, table_training, table_energy
        shape = f"{r.get('M')} x {r.get('K')} x {r.get('N')}"
        if "ms" in r:
            rows.append([r["op"], r["impl"], shape, f"{r['ms']:.3f}", f"{r['tflops']:.0f}"])
        else:
            rows.append([r["op"], r["impl"], shape, _note(r), ""])
    table = _results.markdown_table(
        ["operation", "implementation", "M x K x N", "ms (p50)", "TFLOP/s"], rows, "lllrr"
    )
    lines = [table, "", _results.provenance(data["meta"]), ""]
    if data["meta"].get("quick"):
        lines += [
            "A quick smoke run (smaller shapes, one fixed config): not the targets' shape.",
            "",
        ]
    for what, ratio, target in ratios(data["rows"]):
        got = ("not measured" if ratio is None
               else f"{ratio:.3f}x, " + ("met" if ratio >= target else "missed"))
        lines.append(f"- {what}: **{got}** (target at least {target}x)")
    return "\n".join(lines)


def table_power():
    """The sustained rows of ffn.json: what each layer draws and the clock it runs at."""
    try:
        rows = [r for r in _results.load("ffn")["rows"] if r["op"] == SUSTAINED]
    except FileNotFoundError:
        rows = []
    if not rows:
        return '!!! note "Results pending"\n    No sustained-load rows in `ffn.json` yet.'
    out = []
    for r in rows:
        if "ms" not in r:
            out.append([r["impl"], _note(r), "", "", "", "", ""])
            continue
        out.append([r["impl"], f"{r['ms']:.3f}", f"{r['tflops']:.0f}",
                     f"{r['power_w']:.0f} of {r['power_limit_w']:.0f}",
                     f"{r['sm_mhz']:.0f} of {r['max_sm_mhz']:.0f}",
                     f"{r['tflops'] / (r['sm_mhz'] / 1e3):.0f}",
                     ", ".join(r["clock_reasons"]) or "none"])
    return _results.markdown_table(
        ["3 s back to back", "ms a call", "TFLOP/s", "power (W)", "SM clock (MHz)",
         "TFLOP/s per GHz", "clock held back by"], out, "lrrrrrl")


def table_training():
    """The training layers of ffn.json (the forward keeping Z, dZ1 with its db1, and their peers),
    timed in the same interleaved rounds."""
    try:
        rows = _results.load("ffn")["rows"]
    except FileNotFoundError:
        rows = []
    out = []
    for r in rows:
        if r["op"] != TRAINING:
            continue
        if "ms" not in r:
            out.append([r["impl"], _note(r), ""])
            continue
        out.append([r["impl"], f"{r['ms']:.3f}", f"{r['tflops']:.0f}"])
    if not out:
        return '!!! note "Results pending"\n    No training-layer rows in `ffn.json` yet.'
    return _results.markdown_table(
        ["layer (8192 x 4096 x 16384)", "ms (p50 of rounds)", "TFLOP/s"], out, "lrr")


def energy_fit(rows: list[dict]) -> dict:
    """What an activation costs at the power cap, from the ENERGY rows of ffn.json: energies a
    call (J) of cuBLAS and of our kernel with each activation, and the least-squares slope of
    E(a) - E(none) against the SASS instructions a element n(a) that the activation adds,
    through the origin (n(none) = 0): slope = sum dE n / sum n^2, J per (instruction a element).
    break_even: the instructions a element at which our fused layer would take cuBLAS's energy,
    i.e. its time at the cap (negative: never). KeyError without cuBLAS's or the bias-only row,
    ValueError without a counted activation."""
    got = {r["impl"]: r for r in rows if r["op"] == ENERGY and "joules" in r}
    ours = {r["activation"]: r for r in got.values() if r["impl"].startswith(LINEAR_ACT)}
    cublas = got[CUBLAS]["joules"]
    base = ours["none"]["joules"]
    counted = {a: r for a, r in ours.items() if r.get("sass_per_element", {}).get("total", 0) > 0}
    if not counted:
        raise ValueError("no energy row with a counted activation (sass_per_element)")
    n = np.array([r["sass_per_element"]["total"] for r in counted.values()])
    de = np.array([r["joules"] - base for r in counted.values()])
    slope = float(de @ n / (n @ n))
    return {"cublas": cublas, "none": base, "slope": slope, "break_even": (cublas - base) / slope,
            "joules": {a: r["joules"] for a, r in ours.items()},
            "instructions": {a: r.get("sass_per_element", {}).get("total")
                             for a, r in ours.items()}}


def table_energy():
    """The ENERGY rows: each activation's instructions a element, and each layer's time, clock
    and energy a call at the cap; the energy over the same kernel's bias-only row, and for
    linear_act's rows (the only ones energy_fit is made from) what the fit prices it at."""
    try:
        rows = _results.load("ffn")["rows"]
        fit = energy_fit(rows)
    except (FileNotFoundError, KeyError, ValueError):
        return '!!! note "Results pending"\n    No energy rows in `ffn.json` yet.'
    energy = [r for r in rows if r["op"] == ENERGY and "joules" in r]
    by_impl = {r["impl"]: r for r in energy}
    cublas_ms = by_impl[CUBLAS]["ms"]
    out = []
    for r in energy:
        act = r.get("activation")
        n = r.get("sass_per_element", {}).get("total")  # the row's own count
        base = by_impl.get(r["impl"].removesuffix(act) + "none") if act else None
        extra = f"{1e3 * (r['joules'] - base['joules']):+.1f}" if base else ""
        fitted = n is not None and r["impl"].startswith(LINEAR_ACT)
        model = f"{1e3 * fit['slope'] * n:+.1f}" if fitted else ""
        out.append([r["impl"], "" if n is None else f"{n:.1f}", f"{r['ms']:.3f}",
                    f"{r['sm_mhz']:.0f}", f"{r['joules']:.3f}", extra, model,
                    f"{cublas_ms / r['ms']:.3f}x"])
    return _results.markdown_table(
        ["8192 x 4096 x 16384, 3 s back to back", "SASS instructions a element",
         "ms a call", "SM clock (MHz)", "energy a call (J)",
         "over the same kernel's bias only (mJ)", "linear_act's fit (mJ)", "cuBLAS ms / ms"], out,
        "lrrrrrrr")
