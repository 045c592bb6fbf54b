# %% [markdown]
# # LU, QR and least squares, interactively
#
# Three experiments from the [LU/QR post](../posts/02-lu-qr.md) and the
# [linear-regression post](../posts/03-linear-regression.md), with the knobs in the first cell.
# Everything runs on the NumPy references in `kernelnotes.linalg.reference`, in float64.

# %%
import matplotlib.pyplot as plt
import numpy as np

from kernelnotes.linalg.reference import (
    cgs,
    form_q,
    growth_factor,
    householder_qr,
    lstsq_normal,
    lstsq_qr,
    lu_factor,
    mgs,
)

# the knobs: edit these
sizes = [4, 8, 16, 32, 64]  # matrix orders for the growth-factor experiment
samples = 30  # random matrices per order
degrees = range(1, 16)  # polynomial degrees for the least-squares experiment
seed = 0
rng = np.random.default_rng(seed)

# %% [markdown]
# ## Growth factor of partial pivoting on random matrices
# The worst case is $2^{n-1}$ (Wilkinson's matrix); for Gaussian random matrices the growth
# $\rho_n = \max\lvert u_{ij}\rvert / \max\lvert a_{ij}\rvert$ stays tiny.

# %%
med, worst = [], []
for n in sizes:
    rho = [growth_factor(A, lu_factor(A)[0]) for A in rng.standard_normal((samples, n, n))]
    med.append(np.median(rho))
    worst.append(np.max(rho))
    print(f"n = {n:3d}: median growth {med[-1]:6.2f}, largest {worst[-1]:6.2f}, "
          f"bound 2^(n-1) = {2.0 ** (n - 1):.3g}")
fig, ax = plt.subplots(figsize=(6.4, 3.6))
ax.loglog(sizes, med, "o-", label="median")
ax.loglog(sizes, worst, "s-", label=f"largest of {samples}")
ax.loglog(sizes, np.array(sizes) ** 0.5, "k:", label=r"$\sqrt{n}$")
ax.set_xlabel("$n$")
ax.set_ylabel(r"growth factor $\rho_n$")
ax.legend()
plt.show()

# %% [markdown]
# ## Loss of orthogonality on a matrix you choose
# Here the columns are monomials $1, x, x^2, \dots$ on $[0, 1]$: the more columns, the closer they
# are to being dependent. Replace `make` with your own matrix.

# %%
def make(n_cols: int) -> np.ndarray:
    return np.vander(np.linspace(0.0, 1.0, 60), n_cols, increasing=True)


cols = range(2, 15)
conds, loss = [], {"CGS": [], "MGS": [], "Householder": []}
for k in cols:
    A = make(k)
    conds.append(np.linalg.cond(A))
    for name, Q in (("CGS", cgs(A)[0]), ("MGS", mgs(A)[0]),
                    ("Householder", form_q(householder_qr(A)[0]))):
        loss[name].append(np.linalg.norm(Q.T @ Q - np.eye(k), 2))
fig, ax = plt.subplots(figsize=(6.4, 3.6))
for name, v in loss.items():
    ax.loglog(conds, v, "o-", label=name)
ax.set_xlabel(r"$\kappa_2(A)$")
ax.set_ylabel(r"$\|Q^T Q - I\|_2$")
ax.legend()
plt.show()

# %% [markdown]
# ## Polynomial fits: normal equations against QR
# Fit the exact values of $p(x) = 1 + x + \dots + x^d$ at 50 points; any error is rounding.

# %%
x = np.linspace(0.0, 1.0, 50)
err_ne, err_qr = [], []
for d in degrees:
    X = np.vander(x, d + 1)
    theta = np.ones(d + 1)
    y = X @ theta
    err_ne.append(np.linalg.norm(lstsq_normal(X, y) - theta) / np.linalg.norm(theta))
    err_qr.append(np.linalg.norm(lstsq_qr(X, y) - theta) / np.linalg.norm(theta))
fig, ax = plt.subplots(figsize=(6.4, 3.6))
ax.semilogy(list(degrees), err_ne, "o-", label="normal equations")
ax.semilogy(list(degrees), err_qr, "s-", label="Householder QR")
ax.set_xlabel("degree $d$")
ax.set_ylabel("relative error of the coefficients")
ax.legend()
plt.show()
