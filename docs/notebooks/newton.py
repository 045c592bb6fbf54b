# %% [markdown]
# # Newton's method, interactively
#
# Change `f`, its derivative, the starting point `x0` and the number of iterations in the first
# cell, then re-run the notebook. The solvers are the ones from the
# [Newton post](../posts/01-newton.md): `kernelnotes.newton.newton`, `halley` and `bisection`.

# %%
import math

import matplotlib.pyplot as plt
import numpy as np

from kernelnotes.newton import RootFindingError, bisection, convergence_order, halley, newton

# the problem: edit these
f = lambda x: math.cos(x) - x  # noqa: E731
df = lambda x: -math.sin(x) - 1  # noqa: E731
d2f = lambda x: -math.cos(x)  # noqa: E731
x0, bracket, max_iter = 3.0, (0.0, 1.0), 40

# %% [markdown]
# ## Run the three solvers
# The "true" root is taken as the last bisection midpoint, which is within bisection's tolerance,
# `1e-15 * max(1, |x*|)`, of the root: a few ulps, not the last bit (the cell prints how far it
# lies from Newton's last iterate). Errors below about 1e-15 are at the level of that reference.

# %%
runs = {}
for name, call in {
    "Newton": lambda: newton(f, df, x0, max_iter=max_iter),
    "Halley": lambda: halley(f, df, d2f, x0, max_iter=max_iter),
    "Bisection": lambda: bisection(f, *bracket, max_iter=200),
}.items():
    try:
        runs[name] = call()
    except RootFindingError as err:  # keep the iterates of a failed run to look at them
        print(f"{name}: {err}")
        runs[name] = err.history
root = runs["Bisection"][-1]
for name, x in runs.items():
    print(f"{name:9s} {len(x) - 1:3d} steps, last iterate {x[-1]:.17g}")
gap = (root - runs["Newton"][-1]) / np.spacing(runs["Newton"][-1])
print(f"the reference minus Newton's last iterate: {gap:+.0f} ulps")

# %% [markdown]
# ## Errors on a log scale and the empirical order
# $q_n = \log(e_{n+1}/e_n) / \log(e_n/e_{n-1})$ tends to 2 for Newton and 3 for Halley near a
# simple root.

# %%
fig, ax = plt.subplots(figsize=(6.4, 3.6))
for name, x in runs.items():
    e = np.abs(x - root)
    keep = e > 0
    ax.semilogy(np.arange(len(e))[keep], e[keep], marker="o", ms=3, label=name)
ax.set_xlabel("iteration $n$")
ax.set_ylabel("$|x_n - x^*|$")
ax.legend()
ax.grid(alpha=0.3)
plt.show()

for name in ("Newton", "Halley"):
    e = np.abs(runs[name] - root)
    e = e[e > 1e-14]
    if len(e) >= 3:
        print(name, "orders:", np.round(convergence_order(e), 3))

# %% [markdown]
# ## The tangent lines
# Each Newton step follows the tangent at $x_n$ down to the axis.

# %%
x = runs["Newton"][:5]
lo, hi = min(x.min(), root) - 0.5, max(x.max(), root) + 0.5
grid = np.linspace(lo, hi, 400)
fig, ax = plt.subplots(figsize=(6.4, 3.6))
ax.plot(grid, [f(g) for g in grid], label="$f$")
ax.axhline(0, color="k", lw=0.6)
for a, b in zip(x[:-1], x[1:], strict=True):
    ax.plot([a, a, b], [0, f(a), 0], color="tab:red", lw=1)
ax.plot(x, [0] * len(x), "o", color="tab:red", ms=4, label="$x_n$")
ax.legend()
plt.show()
