# %% [markdown]
# # Gradient descent, interactively
#
# Change the learning rates, the starting point or the curvature in the first cell and re-run the
# notebook. The methods are the ones from the
# [gradient-descent post](../posts/04-gradient-descent.md): `kernelnotes.gd.reference.gd`,
# `momentum` and `adam`.

# %%
import matplotlib.pyplot as plt
import numpy as np

from kernelnotes.gd.reference import adam, gd, momentum, regime, steps_to_tol

# the problems: edit these
rates = [0.05, 0.2, 0.45, 0.7, 1.05]  # learning rates for f(x) = x^2
x0, n_steps, tol = 1.8, 30, 1e-6
c = (1.0, 10.0)  # the bowl f = c1 theta1^2 + c2 theta2^2
theta0 = np.array([-4.0, 2.0])

# %% [markdown]
# ## f(x) = x^2: one factor, 1 - 2 alpha, decides everything

# %%
fig, ax = plt.subplots(figsize=(6.4, 3.6))
for a in rates:
    x = gd(lambda x: 2 * x, x0, a, n_steps)[:, 0]
    ax.semilogy(np.abs(x) + 1e-300, marker="o", ms=3, label=f"alpha = {a}: {regime(a)}")
    print(f"alpha = {a:5}: factor {1 - 2 * a:+.2f}, {regime(a):24s} steps to {tol:g}: "
          f"{steps_to_tol(x0, a, tol)}")
ax.set_ylim(1e-12, 1e6)
ax.set_xlabel("step k")
ax.set_ylabel("|x_k|")
ax.legend(fontsize=7)
plt.show()

# %% [markdown]
# ## A bowl: GD, momentum and Adam
# GD is stable for alpha < 1 / max(c); the heavy ball and Adam use the rates below.

# %%
grad = lambda t: 2 * np.asarray(c) * t  # noqa: E731
f = lambda P: (np.asarray(c) * P**2).sum(axis=1)  # noqa: E731
alpha = 0.9 / max(c)
runs = {
    f"GD, alpha = {alpha:.3f}": gd(grad, theta0, alpha, 100),
    f"momentum, alpha = {alpha:.3f}, beta = 0.5": momentum(grad, theta0, alpha, 0.5, 100),
    "Adam, lr = 0.3": adam(grad, theta0, 100, lr=0.3),
}
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 3.6))
t1, t2 = np.meshgrid(np.linspace(-4.5, 4.5, 121), np.linspace(-2.5, 2.5, 81))
ax0.contour(t1, t2, c[0] * t1**2 + c[1] * t2**2, levels=15, colors="grey", linewidths=0.5)
for name, path in runs.items():
    ax0.plot(path[:, 0], path[:, 1], "-o", ms=2, lw=0.8, label=name)
    ax1.semilogy(np.maximum(f(path), 1e-300), label=name)
ax0.set_aspect("equal")
ax0.legend(fontsize=7)
ax1.set_ylim(1e-14, 1e3)
ax1.set_xlabel("step k")
ax1.set_ylabel("f")
plt.show()
